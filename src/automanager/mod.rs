//! The AutoManager policy core: a sans-IO state machine,
//! [`AutoManagerCore::handle`]`(input, now) -> Step`. Inputs are Manager
//! events, commands, RPC results and timer expiries; a step holds the
//! actions to carry out (Manager RPCs, notifications, command replies) and
//! the next timer deadline. No tokio, no tonic, no clock: time comes in as
//! a [`UnixMillis`](crate::model::UnixMillis) value, so every rule can be tested with a virtual clock.
//! [`runtime`] is the only async part.
//!
//! - [`settings`]: `AutoSettings`, defaults, validation.
//! - [`fleet`]: the fleet view (nodes, inventories, what this core
//!   provisioned and terminated).
//! - [`binding`]: one record per job (node, instance key, placement of
//!   record, in-flight gate); `jobs`: the records, changed only through a
//!   guard that counts the capacity a change gave back.
//! - `facts`: what every subsystem reads — the fleet, the job records, the
//!   bundles, the broken marks, what the fleet is placed with (`placed_with`:
//!   settings, pools, held-back offerings), how new nodes are named. The
//!   capacity epoch (`Facts::capacity_epoch`), which retries jobs that found
//!   nowhere and wakes spares, node services and headroom, is counted by
//!   what owns each change: the fleet's named mutators, the job records'
//!   guard and `PlacedWith`'s mutators (its fields are private). No call
//!   site bumps it; the kept placement view notices changes by itself
//!   (node revisions, bindings, pools).
//! - `outbox`: the calls sent with what each was for (`Pending`), the
//!   notifications and the command replies of a step.
//! - [`recovery`]: runtime-failure policy, restart ceiling, node health.
//! - `core`: the state and the `handle` loop; `readiness`: when a job may
//!   be placed; `timers`: the next deadline and what falls due;
//!   `commands`: each command carried out and answered; `queries`: reads,
//!   what-ifs and metrics; [`views`]: the read model, all the edges see of
//!   the core (views by the core's own rules, a revision per step);
//!   `testing`: the core the edges' unit tests read.
//! - `events` / `dispatch` / `call_results` / `loss`: applying Manager
//!   events; placing and dispatching; what Manager answered to each call;
//!   a lost instance judged by the failure policy, and terminal verdicts.
//! - `succession`: what a core hydrated after a stream break carries over
//!   from the one it replaces, taken at the break and applied once the new
//!   snapshot has been replayed.
//! - `view_cache`: the placement view kept between rounds and brought up
//!   to date instead of rebuilt.
//! - [`spares`]: the hot-spare reconciler, warmth, reservations.
//! - [`node_services`]: eager node-service placement (experimental).
//! - [`drain`]: cordon, drain, evict, terminate; [`interruption`]: spot
//!   interruption / rebalance notices as forced drains.
//! - [`migration`]: the migration saga (`migrateJob`, `abortMigration`).
//! - [`schedule`]: scheduled bundles (the placement lead, the phases, the
//!   end); `manual`: manual jobs started and stopped as a desired state.
//! - [`headroom`]: resilience headroom recomputed after changes, with a
//!   debounce.
//! - [`metrics`], [`notification`]; `protocol`: the inputs, actions and
//!   command errors (what goes in and out of `handle`); `history`: what
//!   Manager's history of a job says of its instances.
//!
//! State owned by concern: the core holds the `Facts`, the `Outbox` and
//! each subsystem's own state as separate fields, so a subsystem is handed
//! the facts (`&Facts` to read, `&mut Facts` to change them through their
//! owners' mutators) and the outbox with its own state, and nothing else of
//! the core: hot spares (`SpareState`), drains (`Drains`, reading the
//! migrations), node services, schedules, headroom, manual jobs
//! (`ManualStarts`, aborting a migration through the saga); the migration
//! saga runs on a `migration::Saga` (facts, outbox, migrations, counters)
//! and loss and verdicts on a `loss::Losses` (facts, outbox, counters,
//! drains). What sends a node away or releases it (`Facts::terminate`,
//! `release_node`, `unbind`) is one method of the facts. The core itself
//! keeps the coordinator's work: routing events, RPC results, commands and
//! timers to their owners, and the placement rounds (jobs, migration
//! targets) against the kept view.
//!
//! Layering: the vocabulary and the state of each subsystem sit in leaf
//! files that never name the core (`protocol`, `settings`, `fleet`,
//! `binding`, `jobs`, `recovery`, `history`, `notification`, `metrics`,
//! `node_ids`, `placed_with`, `outbox`, `facts`, and each subsystem
//! folder's `state` — `drain::state` holds the interruption notices too);
//! `core` holds them all, and the behaviour
//! files (each subsystem's `mod.rs`, `events`, `dispatch`, …) sit on top.
//! Inside this folder every import names the file that defines the item,
//! never a re-export, and no files import each other in a cycle.

pub mod binding;
mod call_results;
mod commands;
mod core;
mod dispatch;
pub mod drain;
mod events;
mod facts;
pub mod fleet;
pub mod headroom;
mod history;
pub mod interruption;
mod jobs;
mod loss;
mod manual;
pub mod metrics;
pub mod migration;
mod node_ids;
pub mod node_services;
pub mod notification;
mod outbox;
mod placed_with;
mod protocol;
mod queries;
mod readiness;
pub mod recovery;
pub mod runtime;
pub mod schedule;
pub mod settings;
pub mod spares;
mod subsystem;
mod succession;
#[cfg(test)]
pub(crate) mod testing;
mod timers;
mod view_cache;
pub mod views;

pub use self::core::AutoManagerCore;
pub use drain::{DrainAfter, DrainJob, DrainJobStatus, DrainOptions, DrainPhase, DrainState, StrategyFor};
pub use interruption::{InterruptionNotice, NodeInterruptionState};
pub use metrics::{HeadroomGauge, Metrics, PoolGauge, PoolUsage, TierUsage};
pub use migration::{
    CLOSE_ABORT_GRACE_MS, GroupPeer, MigrationEnd, MigrationId, MigrationOptions, MigrationPhase, MigrationRefusal,
    MigrationSettings, MigrationState, MigrationStep, MigrationStrategy,
};
pub use notification::{Decision, Notification, PlacementDecisionInfo};
pub use protocol::{
    Action, Answer, Command, CommandError, CommandId, Input, RequestId, Rpc, RpcFailure, RpcFailureKind, Step,
};
pub use queries::{JobView, NodeView};
pub use runtime::{AutoManager, AutoManagerHandle, QueryError, RunError, RunOptions};
pub use settings::{AutoSettings, AutoSettingsValidationError, chart_settings_schema, validate_auto_settings};
pub use views::{BundleView, ReadModel};
