//! The state machine itself: what it holds, how a fresh core starts (a
//! successor's start is `succession`'s) and the `handle` loop (apply the input,
//! then — once hydrated — expire timers and run placement). What makes a
//! job ready to place is `readiness`', the timers `timers`', commands
//! `commands`', the read-only queries and metrics `queries`'.

use std::collections::BTreeSet;

use crate::model::{NodeId, UnixMillis};

use super::drain::state::Drains;
use super::facts::Facts;
use super::manual::state::ManualStarts;
use super::metrics::Counters;
use super::migration::state::Migrations;
use super::notification::Notification;
use super::outbox::{Outbox, Pending};
use super::protocol::{CommandError, CommandId, Input, RequestId, Rpc, Step};
use super::settings::ValidSettings;
use super::subsystem::{Pass, Subsystems};
use super::succession::state::Inheritance;
use super::view_cache::ViewCache;

/// How many salts a process part of a node id tells apart (two base-36
/// digits).
const NODE_ID_SALTS: u64 = 36 * 36;

/// The AutoManager core (see the module docs of [`crate::automanager`]).
/// Cloning it forks the whole state (what benchmarks and what-if runs do).
#[derive(Clone, Debug)]
pub struct AutoManagerCore {
    /// The fleet, the job records, the bundles and what they are placed
    /// with: what every subsystem reads.
    pub(super) facts: Facts,
    /// When this AutoManager's process started (a successor keeps it): its
    /// uptime.
    pub(super) started_at: UnixMillis,
    pub(super) closed: bool,
    /// Nodes whose create Manager may have carried out although the call
    /// failed (it timed out): forgotten as any failed provision, and
    /// terminated should they appear.
    pub(super) unheard_creates: BTreeSet<NodeId>,
    pub(super) counters: Counters,
    /// How many steps this core (and the cores it succeeds) has taken: the
    /// read model's revision.
    pub(super) revision: u64,
    /// The placement view kept between rounds (built at hydration).
    pub(super) view_cache: Option<ViewCache>,
    /// The subsystems behind one interface: schedules, hot spares, node
    /// services, headroom (see `subsystem`).
    pub(super) subsystems: Subsystems,
    /// Drains and interruption notices.
    pub(super) drains: Drains,
    /// Migrations in flight and the most recent ended ones.
    pub(super) migrations: Migrations,
    /// Manual jobs' wanted state and the calls bringing Manager to it.
    pub(super) manual: ManualStarts,
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
        self.facts.node_ids.process = self.started_at.unsigned_abs() * NODE_ID_SALTS + u64::from(salt) % NODE_ID_SALTS;
        self
    }

    pub fn new(valid: ValidSettings, now: UnixMillis) -> Self {
        Self {
            facts: Facts::new(valid, now.unsigned_abs()),
            started_at: now,
            closed: false,
            unheard_creates: BTreeSet::new(),
            counters: Counters::default(),
            revision: 0,
            view_cache: None,
            subsystems: Subsystems::default(),
            drains: Drains::default(),
            migrations: Migrations::default(),
            manual: ManualStarts::default(),
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
        if self.facts.hydrated && !self.closed {
            self.prepare_drains(now);
            self.expire(now);
            self.saga().step_migrations(now);
            self.subsystems
                .step(Pass::BeforePlacement, &mut self.facts, &mut self.outbox, now);
            self.reconcile_manual(now);
            self.place_ready(now);
            self.subsystems
                .step(Pass::AfterPlacement, &mut self.facts, &mut self.outbox, now);
            self.follow_drains();
            self.subsystems.step(Pass::Last, &mut self.facts, &mut self.outbox, now);
        }
        Step {
            actions: self.outbox.take_actions(),
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
                self.subsystems.observe(&event, now);
                self.apply_event(*event, now)
            }
            Input::Command { id, command } => self.command(id, command, now),
            Input::RpcResult { id, result } => self.rpc_result(id, result, now),
            Input::ManagerCapabilities(capabilities) => self.manager = capabilities,
            Input::Timer => {}
            Input::Close => self.close(now),
        }
    }

    pub(super) fn notify(&mut self, notification: Notification) {
        self.outbox.notify(notification);
    }

    /// `TerminateNode`, with `nodeTerminated` fired once per node at issue
    /// time (see [`Facts::terminate`]).
    pub(super) fn terminate(&mut self, node_id: &NodeId) {
        self.facts.terminate(&mut self.outbox, node_id);
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
