//! The AutoManager core: on a virtual clock, one test per rule, a file per
//! concern (`hydration`, `placement`, `recovery`, `restart_ceiling`,
//! `nodes`, `successor`, `spares`, `migration`, `drain`, ...) and as a whole
//! under random events and faults (`simulation`); its runtime against the
//! Manager simulator over loopback (`runtime`, `pools`, and the `*_sim`
//! files).

mod commands;
mod drain;
mod drain_sim;
mod following;
mod group_migration;
mod headroom;
mod hydration;
mod hydration_repairs;
mod job_strategy;
mod maintenance_drain;
mod manual_jobs;
mod migration;
mod migration_aborts;
mod migration_sim;
mod nodes;
mod pass_through;
mod placement;
mod pools;
mod published;
mod recovery;
mod restart_ceiling;
mod runtime;
mod schedules;
mod simulation;
mod spares;
mod spares_sim;
mod successor;
mod unheard_calls;

#[path = "../support/sim.rs"]
mod sim_support;
mod support;
