//! The state machine itself: what it holds, how a fresh core starts (a
//! successor's start is `succession`'s) and the `handle` loop (apply the input,
//! then — once hydrated — expire timers and run placement). What makes a
//! job ready to place is `readiness`', the timers `timers`', commands
//! `commands`', the read-only queries and metrics `queries`'.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Bundle, BundleId, InstanceKey, JobId, MigrationId, NodeId, ReplicaJob, UnixMillis};
use crate::placement::Pools;

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
use super::succession::state::Inheritance;
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

    /// Keeps counting request ids from where `previous` stopped, so an
    /// answer to a predecessor's call is never taken for one of this core's.
    pub(super) fn continue_from(&mut self, previous: &Outbox) {
        self.next_request = previous.next_request;
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
