//! The AutoManager core: on a virtual clock, one test per rule (`scenarios`,
//! `spares`, `migration`, `drain`, ...) and as a whole under random events
//! and faults (`simulation`); its runtime against the Manager simulator over
//! loopback (`runtime`, `pools`, and the `*_sim` files).

mod drain;
mod drain_sim;
mod group_migration;
mod headroom;
mod job_strategy;
mod maintenance_drain;
mod migration;
mod migration_aborts;
mod migration_sim;
mod pass_through;
mod pools;
mod published;
mod runtime;
mod scenarios;
mod simulation;
mod spares;
mod spares_sim;

#[path = "../support/sim.rs"]
mod sim_support;
mod support;
