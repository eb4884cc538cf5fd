//! The state machine itself: what it holds, how a core starts (fresh, or
//! succeeding a disposed one) and the `handle` loop (apply the input,
//! then — once hydrated — expire timers and run placement). What makes a
//! job ready to place is `readiness`', the timers `timers`', commands
//! `commands`', the read-only queries and metrics `queries`'.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Bundle, BundleId, InstanceKey, JobId, MigrationId, NodeId, ReplicaJob, UnixMillis};
use crate::placement::Pools;

use super::binding::{Binding, JobRecord};
use super::drain::state::Drains;
use super::fleet::{Fleet, Offering};
use super::headroom::state::HeadroomState;
use super::jobs::Jobs;
use super::manual::state::ManualStarts;
use super::metrics::Counters;
use super::migration::state::{MigrationCall, Migrations};
use super::node_ids::NodeIds;
use super::node_services::state::{NodeServiceState, ServiceRequest};
use super::notification::Notification;
use super::protocol::{Action, CommandError, CommandId, Input, RequestId, Rpc, Step};
use super::schedule::state::Schedules;
use super::settings::{AutoSettings, ValidSettings};
use super::spares::state::{SpareRequest, SpareState};
use super::view_cache::{FactsRevision, ViewCache};

/// What an outstanding RPC was for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Pending {
    /// The job, and the instance it asked for where (undone when the
    /// answer finds the job placed otherwise).
    StartJob {
        job_id: JobId,
        instance_key: InstanceKey,
        node_id: NodeId,
    },
    CreateNode {
        node_id: crate::model::NodeId,
        for_job: JobId,
    },
    TerminateNode(crate::model::NodeId),
    /// A call of a migration's saga.
    Migration {
        migration_id: MigrationId,
        call: MigrationCall,
    },
    /// The `StopJob` of the instance a timed-out `StartJob` may have
    /// created (the job placed again once it is answered); nothing there to
    /// stop is what it was for.
    UndoStart {
        job_id: JobId,
        instance_key: crate::model::InstanceKey,
        node_id: NodeId,
    },
    /// A `SetTerminalVerdict`: Manager refusing it means the bundle was
    /// updated since (the verdict is moot), which is no error.
    Verdict,
    /// A command's RPC; on success the bundle named is revived (an update
    /// or delete clears its broken mark and restart histories) and the
    /// applied spec's manual jobs are wanted as it says.
    Command {
        id: CommandId,
        revives: Option<BundleId>,
        started: Option<(BundleId, BTreeSet<ReplicaJob>)>,
        /// A `DeleteBundle`: once Manager took it, the bundle is being
        /// deleted and none of its jobs is placed again, whichever of the
        /// answer and Manager's own `deleting` comes first.
        deletes: bool,
    },
    /// A `StartBundleJob` / `StopBundleJob` bringing a manual job to its
    /// wanted state.
    Toggle(JobId),
    /// The `StopJob` of a manual job that is no longer wanted.
    ManualStop(JobId),
    /// The `CompleteJob` of a job whose bundle's schedule ended.
    Complete(JobId),
    /// A hot-spare reconciler RPC.
    Spare(SpareRequest),
    /// A node-service placement RPC.
    NodeService(ServiceRequest),
}

/// What a successor core takes up from its predecessor once hydrated: the
/// AutoManager's own decisions about nodes Manager's snapshot shows, and
/// the starts still on their way.
#[derive(Clone, Debug, Default)]
pub(super) struct Inheritance {
    /// Starts (and the stops undoing timed-out ones) still on their way.
    pub(super) starts: Vec<InheritedStart>,
    /// Its own marks on the nodes it knew.
    pub(super) nodes: BTreeMap<NodeId, NodeMarks>,
    /// The records of its jobs with a migration in flight: the saga
    /// carries on, so the job's record (binding, the target's claim, the
    /// history it has applied) does too, and only what Manager's snapshot
    /// adds to the job's history is applied.
    pub(super) migrating: BTreeMap<JobId, JobRecord>,
    /// Instances (job, key, node) a stop is on its way to (one undoing a
    /// timed-out start, or a migration's stop of its source or target):
    /// Manager's history may show them, but they are going, and never taken
    /// for the job's placement while hydrating.
    pub(super) undoing: BTreeSet<(JobId, InstanceKey, NodeId)>,
    /// Nodes a job left while the snapshot was replayed (node, whether a
    /// single-use job left it): whether each is empty is known only once
    /// every job has been read, so they are released then.
    pub(super) releases: Vec<(NodeId, bool)>,
    /// What it knew of each job that Manager's history does not say,
    /// for the generation of the bundle it knew.
    pub(super) jobs: BTreeMap<JobId, CarriedJob>,
    /// Its broken bundles, each with the generation it was decided for:
    /// announced already (`bundleBroken`), they stand whether or not the
    /// verdict's write reached Manager before the snapshot, until the
    /// bundle is updated or deleted.
    pub(super) broken: BTreeMap<BundleId, (String, u64)>,
}

/// A start (or a stop undoing one) a successor inherits on its way.
#[derive(Clone, Debug)]
pub(super) struct InheritedStart {
    pub(super) id: RequestId,
    pub(super) job_id: JobId,
    /// It held its job's in-flight gate. A job has one gate, naming the
    /// call its predecessor awaited; a call issued before it (a stray's
    /// stop at hydration, then the shedding of an over-committed node's
    /// instance of the same job) lost the gate to the later one, and its
    /// answer is handled without opening the gate. Handing the gate to
    /// whichever call comes first instead would leave the start the
    /// predecessor awaited unbound, its instance nobody's placement.
    pub(super) holds_gate: bool,
    /// The binding a start holding the gate was for.
    pub(super) binding: Option<Binding>,
}

/// What a successor takes up of one of its predecessor's jobs, while the
/// job's bundle is still at `generation`.
#[derive(Clone, Debug)]
pub(super) struct CarriedJob {
    pub(super) generation: u64,
    /// Its restart history as counted (a node provisioned for the job
    /// started, a loss Manager records as something else — history cannot
    /// say), and how many of the history's entries that count (runtime
    /// failures, spec changes) it had read: the count carries on, plus
    /// those read since.
    pub(super) restarts: super::recovery::RestartHistory,
    pub(super) counted: usize,
    /// Where it was bound (a dispatched or running instance): replaying
    /// history alone cannot tell which of two live instances is the job's
    /// (a migration that failed forward while the source's stop was on its
    /// way leaves both), so this stands while history shows it live.
    pub(super) binding: Option<Binding>,
    /// Dropped (announced with `jobDropped`, whether or not its verdict
    /// reached Manager).
    pub(super) dropped: bool,
}

/// What an AutoManager decided about a node, which Manager's snapshot does
/// not say.
#[derive(Clone, Debug, Default)]
pub(super) struct NodeMarks {
    /// It provisioned the node, and how.
    pub(super) provisioned: Option<super::fleet::Provisioned>,
    /// It terminated the node.
    pub(super) terminated: bool,
    /// A single-use job left it: released once empty.
    pub(super) release_when_empty: bool,
}

/// How many salts a process part of a node id tells apart (two base-36
/// digits).
const NODE_ID_SALTS: u64 = 36 * 36;

/// The AutoManager core (see the module docs of [`crate::automanager`]).
/// Cloning it forks the whole state (what benchmarks and what-if runs do).
#[derive(Clone, Debug)]
pub struct AutoManagerCore {
    pub(super) settings: AutoSettings,
    pub(super) pools: Pools,
    /// When this AutoManager's process started (a successor keeps it): its
    /// uptime.
    pub(super) started_at: UnixMillis,
    /// The process part of the node ids it names (a successor keeps it):
    /// its start time, salted by the embedder so two processes started in
    /// the same millisecond (a leader and its standby) never name one node.
    pub(super) process: u64,
    pub(super) hydrated: bool,
    pub(super) closed: bool,
    pub(super) fleet: Fleet,
    pub(super) jobs: Jobs,
    pub(super) bundles: BTreeMap<BundleId, Bundle>,
    pub(super) broken: BTreeMap<BundleId, String>,
    pub(super) next_node_serial: u64,
    /// Nodes whose create Manager may have carried out although the call
    /// failed (it timed out): forgotten as any failed provision, and
    /// terminated should they appear.
    pub(super) unheard_creates: BTreeSet<NodeId>,
    pub(super) counters: Counters,
    /// Counts the changes to what the fleet is placed with: settings,
    /// pools, template images, a held-back tier or offering offered again
    /// (see [`AutoManagerCore::capacity_epoch`]).
    pub(super) placed_with_revision: u64,
    /// How many steps this core (and the cores it succeeds) has taken: the
    /// read model's revision.
    pub(super) revision: u64,
    /// (pool, tier) -> until when provisioning there is held back.
    pub(super) tier_backoff: BTreeMap<(String, String), UnixMillis>,
    /// Offerings a provider had no capacity for -> until when they are
    /// skipped (see `offerings`).
    pub(super) exhausted_offerings: BTreeMap<Offering, UnixMillis>,
    /// The placement view kept between rounds (built at hydration).
    pub(super) view_cache: Option<ViewCache>,
    /// The hot-spare reconciler's own state.
    pub(super) spares: SpareState,
    /// Where node services are placed.
    pub(super) node_services: NodeServiceState,
    /// Drains and interruption notices.
    pub(super) drains: Drains,
    /// Migrations in flight and the most recent ended ones.
    pub(super) migrations: Migrations,
    /// Scheduled bundles: phases seen, completions at the end.
    pub(super) schedules: Schedules,
    /// Manual jobs' wanted state and the calls bringing Manager to it.
    pub(super) manual: ManualStarts,
    /// Resilience headroom, kept up to date with the fleet.
    pub(super) headroom: HeadroomState,
    /// What a disposed predecessor left this core, taken up at hydration
    /// (see [`AutoManagerCore::succeeding`]).
    pub(super) inherited: Inheritance,
    /// What steps send out, and the calls awaiting their answers.
    pub(super) outbox: Outbox,
    /// What the Manager at hand serves beyond the published API (every
    /// addition until the runtime says otherwise): a handover runs as
    /// overlap where Manager relays no migration signals.
    pub(super) manager: crate::model::manager::Capabilities,
}

impl AutoManagerCore {
    /// A core for validated settings, started at `now`. It places nothing
    /// until Manager's `InitialDataComplete`.
    /// This core names its nodes with `salt` beside its start time (the
    /// runtime draws it at random): a standby started in the same
    /// millisecond as its leader then never names a node its leader named.
    #[must_use]
    pub fn salted(mut self, salt: u16) -> Self {
        self.process = self.started_at.unsigned_abs() * NODE_ID_SALTS + u64::from(salt) % NODE_ID_SALTS;
        self
    }

    pub fn new(valid: ValidSettings, now: UnixMillis) -> Self {
        Self {
            settings: valid.settings,
            pools: valid.pools,
            started_at: now,
            process: now.unsigned_abs(),
            hydrated: false,
            closed: false,
            fleet: Fleet::default(),
            jobs: Jobs::default(),
            bundles: BTreeMap::new(),
            broken: BTreeMap::new(),
            next_node_serial: 0,
            unheard_creates: BTreeSet::new(),
            counters: Counters::default(),
            placed_with_revision: 0,
            revision: 0,
            tier_backoff: BTreeMap::new(),
            exhausted_offerings: BTreeMap::new(),
            view_cache: None,
            spares: SpareState::default(),
            node_services: NodeServiceState::default(),
            drains: Drains::default(),
            migrations: Migrations::default(),
            schedules: Schedules::default(),
            manual: ManualStarts::default(),
            headroom: Default::default(),
            inherited: Inheritance::default(),
            outbox: Outbox::default(),
            manager: crate::model::manager::Capabilities::all_served(),
        }
    }

    /// A fresh core that carries on from a disposed one: after a stream
    /// break the runtime hydrates a new core from the new snapshot. What
    /// Manager's snapshot cannot say is this AutoManager's own and carries
    /// over: the counters (so `metrics()` stays cumulative), the drains,
    /// cordons and interruption notices, the calls still on their way and
    /// what each was for (starts hold their job's gate and room until
    /// answered), which nodes it provisioned, terminated or is to release
    /// once empty, and the migrations in flight with their jobs' records:
    /// a saga carries on where it was (its calls' answers reach it, its
    /// deadlines stand in for signals sent while the stream was down), as
    /// neither rolling back nor failing forward blind is safe — the
    /// disposed core may have told the source to stop, or not yet.
    pub fn succeeding(valid: ValidSettings, previous: &AutoManagerCore) -> Self {
        let mut core = Self::new(valid, previous.started_at);
        core.process = previous.process;
        core.counters = previous.counters.clone();
        core.manager = previous.manager.clone();
        core.fleet.carry_declarations(&previous.fleet);
        // `updateHotSpareSpecs` replaced the list without a reconnect; a
        // reconnect keeps it.
        core.settings.hot_spares = previous.settings.hot_spares.clone();
        core.outbox.next_request = previous.outbox.next_request;
        // Revisions keep counting: a reading of the new core is never
        // taken for one of the old.
        core.revision = previous.revision;
        // Node ids keep counting, so a node Manager has already forgotten is
        // never named again by this process.
        core.next_node_serial = previous.next_node_serial;
        core.unheard_creates = previous.unheard_creates.clone();
        core.drains = Drains::carried_from(&previous.drains, &previous.fleet);
        core.schedules = Schedules::carried_from(&previous.schedules);
        core.manual = ManualStarts::carried_from(&previous.manual);
        core.migrations = Migrations::carried_from(&previous.migrations);
        core.inherited.migrating = previous
            .jobs
            .iter()
            .filter(|(_, record)| record.migration.is_some())
            .map(|(id, record)| (id.clone(), record.clone()))
            .collect();
        // Calls still on their way are answered here: commands (a toggle
        // in flight answers the commands that wait on it), creates and
        // terminates, and starts with the stops undoing timed-out ones —
        // Manager may carry those out after its snapshot was taken, so
        // each start holds its job's gate shut and its room reserved until
        // answered; left unknown, a start landing late would put the job
        // beside its new placement, or over the room given to another.
        // The gate each job's calls held: the predecessor's records name it
        // once it has taken up its own inheritance; before that (disposed
        // while still hydrating) its inheritance does.
        let gate_of = |id: RequestId, job_id: &JobId| -> (bool, Option<Binding>) {
            if previous.hydrated {
                let record = previous.jobs.get(job_id).filter(|r| r.in_flight == Some(id));
                return (record.is_some(), record.and_then(|r| r.binding.clone()));
            }
            previous
                .inherited
                .starts
                .iter()
                .find(|s| s.id == id)
                .map_or((false, None), |s| (s.holds_gate, s.binding.clone()))
        };
        for (id, pending) in &previous.outbox.pending {
            match pending {
                Pending::Command { .. }
                | Pending::Toggle(_)
                | Pending::CreateNode { .. }
                | Pending::Spare(SpareRequest::Provision { .. })
                | Pending::TerminateNode(_) => {}
                Pending::Migration { migration_id, call } => {
                    // A stop of a migration's source or target still on its
                    // way: the instance is going even when the saga ended
                    // (a source whose stop went unanswered past its
                    // deadline), so it is never taken back for the job.
                    if let Some(m) = previous.migrations.get(migration_id) {
                        let going = match call {
                            MigrationCall::StopSource => Some((&m.source_key, &m.source_node_id)),
                            MigrationCall::StopTarget => Some((&m.target_key, &m.target_node_id)),
                            _ => None,
                        };
                        if let Some((key, node)) = going {
                            core.inherited
                                .undoing
                                .insert((m.job_id.clone(), key.clone(), node.clone()));
                        }
                    }
                }
                Pending::StartJob { job_id, .. } => {
                    let (holds_gate, binding) = gate_of(*id, job_id);
                    core.inherited.starts.push(InheritedStart {
                        id: *id,
                        job_id: job_id.clone(),
                        holds_gate,
                        binding,
                    });
                }
                Pending::UndoStart {
                    job_id,
                    instance_key,
                    node_id,
                } => {
                    core.inherited.starts.push(InheritedStart {
                        id: *id,
                        job_id: job_id.clone(),
                        holds_gate: gate_of(*id, job_id).0,
                        binding: None,
                    });
                    core.inherited
                        .undoing
                        .insert((job_id.clone(), instance_key.clone(), node_id.clone()));
                }
                _ => continue,
            }
            core.outbox.pending.insert(*id, pending.clone());
        }
        for node in previous.fleet.iter() {
            // A node it was launching keeps its provision deadline (one the
            // snapshot shows starting would otherwise wait forever), and one
            // Manager has not announced yet stays, so its create's answer
            // finds it.
            if node.is_launching()
                && let Some(provisioned) = &node.provisioned
            {
                core.fleet.add_provisioned(node.id.clone(), provisioned.clone());
            }
            // Which nodes it provisioned (what `singleUse` may release),
            // terminated (they take nothing new; a terminate Manager did not
            // hear is sent again) or is to release once empty.
            if node.provisioned.is_some() || node.terminated || node.release_when_empty {
                core.inherited.nodes.insert(
                    node.id.clone(),
                    NodeMarks {
                        provisioned: node.provisioned.clone(),
                        terminated: node.terminated,
                        release_when_empty: node.release_when_empty,
                    },
                );
            }
        }
        let generation = |bundle: &BundleId| previous.bundles.get(bundle).map_or(0, |b| b.generation);
        core.inherited.broken = previous
            .broken
            .iter()
            .map(|(bundle, reason)| (bundle.clone(), (reason.clone(), generation(bundle))))
            .collect();
        core.inherited.jobs = previous
            .jobs
            .iter()
            .map(|(id, record)| {
                let read = &record.job.history[..record.history_seen.min(record.job.history.len())];
                let carried = CarriedJob {
                    generation: generation(&record.bundle_ref.bundle_id),
                    restarts: record.restarts.clone(),
                    counted: read
                        .iter()
                        .filter(|e| crate::automanager::recovery::counts_for_restarts(e))
                        .count(),
                    // A migrating job's record is carried whole.
                    binding: record.binding.clone().filter(|b| {
                        record.migration.is_none() && b.phase != super::binding::BindingPhase::AwaitingNode
                    }),
                    dropped: record.dropped,
                };
                (id.clone(), carried)
            })
            .collect();
        core.spares = SpareState::carried_from(&previous.spares);
        core
    }

    /// Feeds one input at `now`; returns what to do and when to wake.
    pub fn handle(&mut self, input: Input, now: UnixMillis) -> Step {
        self.handle_all([input], now)
    }

    /// Feeds several inputs that arrived together at `now`, then expires
    /// timers and places once: the same outcome as feeding them one by one
    /// with the clock standing still, without a placement round per input
    /// (a snapshot of 100,000 events is one round, not 100,000).
    pub fn handle_all(&mut self, inputs: impl IntoIterator<Item = Input>, now: UnixMillis) -> Step {
        self.revision += 1;
        for input in inputs {
            self.apply(input, now);
        }
        if self.hydrated && !self.closed {
            self.prepare_drains(now);
            self.expire(now);
            self.saga().step_migrations(now);
            let parts = self.parts();
            parts.schedules.step(&parts.facts.read(), parts.outbox, now);
            self.reconcile_manual(now);
            self.place_ready(now);
            let mut parts = self.parts();
            parts.spares.reconcile(&mut parts.facts, parts.outbox, now);
            let parts = self.parts();
            parts.node_services.place(&parts.facts.read(), parts.outbox, now);
            self.follow_drains();
            let parts = self.parts();
            parts.headroom.step(&parts.facts.read(), parts.outbox, now);
        }
        Step {
            actions: std::mem::take(&mut self.outbox.actions),
            next_deadline: self.next_deadline(now),
        }
    }

    fn apply(&mut self, input: Input, now: UnixMillis) {
        if self.closed {
            if let Input::Command { id, .. } = input {
                self.reply(id, Err(CommandError::Closed));
            }
            return;
        }
        match input {
            Input::Event(event) => {
                self.spares.observe(&event, now);
                self.apply_event(*event, now)
            }
            Input::Command { id, command } => self.command(id, command, now),
            Input::RpcResult { id, result } => self.rpc_result(id, result, now),
            Input::ManagerCapabilities(capabilities) => self.manager = capabilities,
            Input::Timer => {}
            Input::Close => self.close(now),
        }
    }

    /// Moves whenever capacity may have appeared or the fleet changed in a
    /// way the spare reconciler, node services and headroom must see: a job
    /// that found nowhere is retried once it moves. Each part is counted by
    /// what owns the change — the fleet ([`Fleet::changes`]), the job
    /// records (a hold ended or moved, [`Jobs::released`]) and what the
    /// fleet is placed with — so no change can be made without it.
    pub(super) fn capacity_epoch(&self) -> u64 {
        capacity_epoch(&self.fleet, &self.jobs, self.placed_with_revision)
    }

    /// Where the facts stand now (see [`FactsRevision`]).
    pub(super) fn facts_revision(&self) -> FactsRevision {
        FactsRevision {
            fleet: self.fleet.revision(),
            jobs: self.jobs.revision(),
            placed_with: self.placed_with_revision,
        }
    }

    pub(super) fn notify(&mut self, notification: Notification) {
        self.outbox.notify(notification);
    }

    /// The core taken apart: the facts (read through [`FactsMut::read`],
    /// changed only through their owners' mutators), the outbox, and each
    /// subsystem's own state — what a subsystem is handed.
    pub(super) fn parts(&mut self) -> Parts<'_> {
        let Self {
            fleet,
            jobs,
            bundles,
            settings,
            pools,
            process,
            next_node_serial,
            placed_with_revision,
            outbox,
            node_services,
            schedules,
            headroom,
            spares,
            drains,
            migrations,
            hydrated,
            inherited,
            counters,
            manual,
            broken,
            ..
        } = self;
        Parts {
            facts: FactsMut {
                fleet,
                jobs,
                bundles,
                broken,
                settings,
                pools,
                node_ids: NodeIds {
                    process: *process,
                    serial: next_node_serial,
                },
                placed_with_revision: *placed_with_revision,
                hydrated: *hydrated,
                held_releases: &mut inherited.releases,
            },
            outbox,
            node_services,
            schedules,
            headroom,
            spares,
            drains,
            migrations,
            counters,
            manual,
        }
    }

    /// The facts, read-only (see [`Facts`]).
    pub(super) fn facts(&self) -> Facts<'_> {
        let epoch = self.capacity_epoch();
        Facts::of(
            &self.fleet,
            &self.jobs,
            &self.bundles,
            &self.settings,
            &self.pools,
            epoch,
        )
    }

    /// `TerminateNode`, with `nodeTerminated` fired once per node at issue
    /// time (see [`FactsMut::terminate`]).
    pub(super) fn terminate(&mut self, node_id: &NodeId) {
        let mut parts = self.parts();
        parts.facts.terminate(parts.outbox, node_id);
    }

    pub(super) fn call(&mut self, rpc: Rpc, pending: Pending) -> RequestId {
        self.outbox.call(rpc, pending)
    }

    fn close(&mut self, now: UnixMillis) {
        // Before the timers stop: in-flight migrations are aborted (or,
        // past the point of no return, marked lost) while calls can still
        // be made.
        self.saga().close_migrations(now);
        self.closed = true;
        let waiting: Vec<CommandId> = self
            .outbox
            .pending
            .values()
            .filter_map(|p| match p {
                Pending::Command { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        for id in waiting {
            self.reply(id, Err(CommandError::Closed));
        }
        self.outbox.pending.clear();
    }
}

/// See [`AutoManagerCore::capacity_epoch`].
fn capacity_epoch(fleet: &Fleet, jobs: &Jobs, placed_with_revision: u64) -> u64 {
    fleet.changes() + jobs.released() + placed_with_revision
}

/// What a subsystem reads of the core's facts, handed to it with its own
/// state and the outbox (the rules that read facts alone, such as a
/// bundle's schedule or a pool's spare count, are methods of it):
/// the fleet, the job records, the bundles, the settings and pools in force
/// and the capacity epoch. It changes none of them.
pub(super) struct Facts<'a> {
    pub(super) fleet: &'a Fleet,
    pub(super) jobs: &'a Jobs,
    pub(super) bundles: &'a BTreeMap<BundleId, Bundle>,
    pub(super) settings: &'a AutoSettings,
    pub(super) pools: &'a Pools,
    pub(super) capacity_epoch: u64,
}

impl<'a> Facts<'a> {
    fn of(
        fleet: &'a Fleet,
        jobs: &'a Jobs,
        bundles: &'a BTreeMap<BundleId, Bundle>,
        settings: &'a AutoSettings,
        pools: &'a Pools,
        capacity_epoch: u64,
    ) -> Self {
        Self {
            fleet,
            jobs,
            bundles,
            settings,
            pools,
            capacity_epoch,
        }
    }
}

/// The facts with leave to change them, through their owners' mutators
/// (which keep the capacity epoch), and the fleet actions that change them
/// and tell Manager together (`terminate`, `release_node`, `unbind`). What
/// changes the facts (spares, drains, manual jobs, the saga, losses) is
/// handed this and the outbox; [`FactsMut::read`] is what the others read.
pub(super) struct FactsMut<'a> {
    pub(super) fleet: &'a mut Fleet,
    pub(super) jobs: &'a mut Jobs,
    pub(super) bundles: &'a BTreeMap<BundleId, Bundle>,
    /// The broken bundles, each with its reason.
    pub(super) broken: &'a mut BTreeMap<BundleId, String>,
    pub(super) settings: &'a AutoSettings,
    pub(super) pools: &'a Pools,
    /// How the nodes this core provisions are named.
    pub(super) node_ids: NodeIds<'a>,
    placed_with_revision: u64,
    /// Whether Manager's snapshot has been taken in.
    pub(super) hydrated: bool,
    /// Nodes released before hydration, released once it is done.
    pub(super) held_releases: &'a mut Vec<(NodeId, bool)>,
}

impl FactsMut<'_> {
    /// The facts as they stand, read-only.
    pub(super) fn read(&self) -> Facts<'_> {
        let capacity_epoch = capacity_epoch(self.fleet, self.jobs, self.placed_with_revision);
        Facts::of(
            self.fleet,
            self.jobs,
            self.bundles,
            self.settings,
            self.pools,
            capacity_epoch,
        )
    }

    /// `TerminateNode`, with `nodeTerminated` fired once per node at issue
    /// time.
    pub(super) fn terminate(&mut self, outbox: &mut Outbox, node_id: &NodeId) {
        if !self.fleet.terminate(node_id) {
            return;
        }
        outbox.call(
            Rpc::TerminateNode {
                node_id: node_id.clone(),
            },
            Pending::TerminateNode(node_id.clone()),
        );
        outbox.notify(Notification::NodeTerminated {
            node_id: node_id.clone(),
        });
    }
}

/// The core taken apart ([`AutoManagerCore::parts`]).
pub(super) struct Parts<'a> {
    pub(super) facts: FactsMut<'a>,
    pub(super) outbox: &'a mut Outbox,
    pub(super) node_services: &'a mut NodeServiceState,
    pub(super) schedules: &'a mut Schedules,
    pub(super) headroom: &'a mut HeadroomState,
    pub(super) spares: &'a mut SpareState,
    pub(super) drains: &'a mut Drains,
    pub(super) migrations: &'a mut Migrations,
    pub(super) counters: &'a mut Counters,
    pub(super) manual: &'a mut ManualStarts,
}

/// What the core sends out: Manager calls, each kept with what it was for
/// until its answer comes back, notifications and command replies, in the
/// order a step made them. A step hands its actions to the runtime; the
/// calls' purposes stay until answered (a successor core takes over those
/// whose answers still matter, see [`AutoManagerCore::succeeding`]).
#[derive(Clone, Debug, Default)]
pub(super) struct Outbox {
    /// This step's actions so far.
    actions: Vec<Action>,
    /// Calls sent and not yet answered, with what each was for.
    pub(super) pending: BTreeMap<RequestId, Pending>,
    /// The last request id given out (a successor keeps counting).
    next_request: u64,
}

impl Outbox {
    /// Sends `rpc`, kept as `pending` until answered.
    pub(super) fn call(&mut self, rpc: Rpc, pending: Pending) -> RequestId {
        self.next_request += 1;
        let id = RequestId(self.next_request);
        self.pending.insert(id, pending);
        self.actions.push(Action::Call { id, rpc });
        id
    }

    /// Sends a notification.
    pub(super) fn notify(&mut self, notification: Notification) {
        self.actions.push(Action::Notify(notification));
    }

    /// Sends a command's reply (or answer).
    pub(super) fn reply(&mut self, action: Action) {
        self.actions.push(action);
    }

    /// Whether a stop of instance `key` of `job_id` on `node_id` that
    /// undoes a start or a stray is on its way: the instance is going,
    /// whatever Manager's history says of it yet.
    pub(super) fn stopping(&self, job_id: &JobId, key: &InstanceKey, node_id: &NodeId) -> bool {
        self.pending.values().any(|p| {
            matches!(p, Pending::UndoStart { job_id: j, instance_key: k, node_id: n }
                if j == job_id && k == key && n == node_id)
        })
    }

    /// What call `id` was for, now that it is answered; `None` for a call
    /// this core does not wait on.
    pub(super) fn answered(&mut self, id: RequestId) -> Option<Pending> {
        self.pending.remove(&id)
    }
}
