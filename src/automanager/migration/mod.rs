//! The migration saga: moving a running bundle job from one node to another
//! (`migrateJob`). The saga's vocabulary — ids, strategies, phases, the
//! state every phase transition is recorded in, the migrations in flight
//! and the steps relayed to their instances — is `state`'s; the
//! `migration` settings (one deadline per phase) and why a migration is
//! refused have a file each; the other submodules are the saga itself:
//! placing the target through the ordinary placement path (`start`),
//! driving each strategy through its phases on Manager's events
//! (`observe`), and deadlines, aborts and `close()` (`wind_down`).
//! Co-located jobs move as a unit: [`group`] says how a group is placed
//! onto one target and cut over together.
//!
//! The job's record ([`super::binding::JobRecord`]) carries the migration
//! claim: the target instance, reserved on its node next to the source for
//! as long as both exist, and moved into the binding at `done`.
//!
//! The saga runs on a [`Saga`]: the facts (changed through their owners'
//! mutators), the outbox, the migrations' own state, the counters and
//! whether Manager relays migration signals — nothing else of the core. Placing a target is a placement round, so
//! `start` runs on the core and hands the placed target to the saga.

pub mod group;
mod observe;
mod rebind;
pub(super) mod refusal;
pub(super) mod settings;
mod start;
pub(super) mod state;
mod wind_down;

pub use refusal::MigrationRefusal;
pub use settings::{
    DEFAULT_MIGRATION_HANDOVER_STEP_TIMEOUT_MS, DEFAULT_MIGRATION_PLACING_TIMEOUT_MS,
    DEFAULT_MIGRATION_START_TIMEOUT_MS, DEFAULT_MIGRATION_STOPPING_SOURCE_TIMEOUT_MS, MigrationSettings,
};

pub use crate::model::{MigrationId, MigrationPhase, MigrationStrategy};
pub(crate) use state::MigrationCall;
pub use state::{
    CLOSE_ABORT_GRACE_MS, ENDED_MIGRATIONS_KEPT, GroupPeer, MigrationEnd, MigrationOptions, MigrationState,
    MigrationStep, PhaseTransition,
};

use crate::model::manager::Capability;
use crate::model::{JobId, UnixMillis};

use super::binding::MigrationClaim;
use super::core::AutoManagerCore;
use super::facts::Facts;
use super::metrics::Counters;
use super::notification::Notification;
use super::outbox::{Outbox, Pending};
use super::protocol::Rpc;
use state::{Migrations, SourceStop};

/// What the saga is handed: the facts, the outbox, the migrations' own
/// state, the counters and whether Manager relays migration signals.
pub(super) struct Saga<'a> {
    pub(super) facts: &'a mut Facts,
    pub(super) outbox: &'a mut Outbox,
    pub(super) migrations: &'a mut Migrations,
    pub(super) counters: &'a mut Counters,
    /// The Manager at hand relays migration signals to instances.
    pub(super) relays_signals: bool,
}

impl AutoManagerCore {
    /// The core taken apart for the saga.
    pub(super) fn saga(&mut self) -> Saga<'_> {
        let relays_signals = self.manager.serves(Capability::MigrationSignals);
        Saga {
            facts: &mut self.facts,
            outbox: &mut self.outbox,
            migrations: &mut self.migrations,
            counters: &mut self.counters,
            relays_signals,
        }
    }
}

impl AutoManagerCore {
    /// `migrationById`.
    pub fn migration_by_id(&self, id: &MigrationId) -> Option<&MigrationState> {
        self.migrations.get(id)
    }

    /// `migrationForJob`: the job's migration in flight, else its most
    /// recent ended one.
    pub fn migration_for_job(&self, job: &JobId) -> Option<&MigrationState> {
        self.facts
            .jobs
            .get(job)
            .and_then(|r| r.migration.as_ref())
            .and_then(|c| self.migrations.get(&c.migration_id))
            .or_else(|| self.migrations.latest_ended_for(job))
    }

    /// `migrations()`: in flight and recently ended, oldest first.
    pub fn migrations(&self) -> Vec<&MigrationState> {
        self.migrations.all()
    }
}

impl Saga<'_> {
    /// Enters `phase` at `now`: recorded with its timestamp, its deadline
    /// set from the `migration` settings, `migrationPhase` fired. Telling
    /// the source to stop (or to stop output) passes the point of no
    /// return.
    fn enter_phase(&mut self, id: &MigrationId, phase: MigrationPhase, now: UnixMillis) {
        let deadline = self
            .facts
            .settings()
            .migration
            .timeout_ms(phase)
            .map(|ms| now + ms as i64);
        let Some(state) = self.migrations.get_mut(id) else {
            return;
        };
        state.phase = phase;
        state.transitions.push(PhaseTransition { phase, at: now });
        state.phase_deadline = deadline;
        if matches!(phase, MigrationPhase::StoppingOutput | MigrationPhase::StoppingSource) {
            state.past_point_of_no_return = true;
        }
        let snapshot = Box::new(state.clone());
        if phase.is_ended() {
            self.migrations.mark_ended(id);
        }
        self.outbox.notify(Notification::MigrationPhase(snapshot));
    }

    /// A relayed step to both of a migration's instances.
    fn signal(&mut self, id: &MigrationId, step: MigrationStep) {
        // An abort tells a handover's instances that it is off. A Manager
        // that relays no signals runs no handover (it runs as overlap, see
        // `strategy_for`) and has no instance to tell: asking it would
        // only fail, and report an error where nothing went wrong. Any
        // other step is sent, so that a Manager that stopped relaying
        // mid-handover refuses it and the migration rolls back at once.
        if !self.relays_signals && matches!(step, MigrationStep::Abort(_)) {
            return;
        }
        let Some(state) = self.migrations.get(id) else {
            return;
        };
        let rpc = Rpc::SendMigrationSignal {
            migration_id: id.clone(),
            job_id: state.job_id.clone(),
            source_key: state.source_key.clone(),
            target_key: state.target_key.clone(),
            signal: step,
        };
        self.call_for(id, rpc, MigrationCall::Signal);
    }

    /// `StopJob` of the source. Told again (Manager did not hear it, a
    /// deadline passed), it is the same instance waited for, with one more
    /// stop on its way.
    fn stop_source(&mut self, id: &MigrationId) {
        let Some(state) = self.migrations.get(id) else {
            return;
        };
        let rpc = Rpc::StopJob {
            job_id: state.job_id.clone(),
            instance_key: state.source_key.clone(),
            node_id: state.source_node_id.clone(),
        };
        let (node, key) = (state.source_node_id.clone(), state.source_key.clone());
        let stops = self
            .migrations
            .stopping_sources
            .entry(state.job_id.clone())
            .or_default();
        match stops.iter_mut().find(|s| s.is(&node, &key)) {
            Some(stop) => stop.unanswered += 1,
            None => stops.push(SourceStop {
                node_id: node,
                instance_key: key,
                unanswered: 1,
                stopped: false,
            }),
        }
        self.call_for(id, rpc, MigrationCall::StopSource);
    }

    /// `StartPreparedJob` of the target.
    fn start_prepared(&mut self, id: &MigrationId) {
        let Some(state) = self.migrations.get(id) else {
            return;
        };
        let rpc = Rpc::StartPreparedJob {
            job_id: state.job_id.clone(),
            instance_key: state.target_key.clone(),
            node_id: state.target_node_id.clone(),
        };
        self.migrations.prepared_start_awaited.insert(id.clone());
        self.call_for(id, rpc, MigrationCall::StartPrepared);
    }

    fn call_for(&mut self, id: &MigrationId, rpc: Rpc, call: MigrationCall) {
        self.outbox.call(
            rpc,
            Pending::Migration {
                migration_id: id.clone(),
                call,
            },
        );
    }

    /// The in-flight migration `id` and its job's claim, when both hold.
    fn in_flight(&self, id: &MigrationId) -> Option<(&MigrationState, &MigrationClaim)> {
        let state = self.migrations.get(id).filter(|m| m.is_in_flight())?;
        let claim = self
            .facts
            .jobs
            .get(&state.job_id)?
            .migration
            .as_ref()
            .filter(|c| &c.migration_id == id)?;
        Some((state, claim))
    }
}
