//! A Norsk Manager simulator: the Manager gRPC service over a simulated
//! fleet (AWS and OCI regions with provisioning latency and launch limits,
//! cluster nodes, workers with inventories and held images, jobs, bundles,
//! keepalive timeouts, migration handover, image prefetch, audit), plus the
//! `SimAdmin` service that injects faults and dumps the state. Tests,
//! benchmarks and the demo start it in-process with [`Simulator::start`];
//! `norsk-auto-manager sim` serves it and `simctl` drives its admin side.
//!
//! Behaviour is deterministic for a given seed and request sequence, and
//! every simulated delay is divided by the time scale.

mod admin_service;
pub mod catalog;
mod clock;
mod error;
mod faults;
pub mod inspect;
mod manager_service;
pub mod published;
mod server;
mod stream;
mod world;

pub use catalog::{Catalog, CatalogError};
pub use error::RequestError;
pub use faults::manager_rpcs;
pub use inspect::SimSnapshot;
pub use server::{ClusterNode, SimConfig, SimHandle, SimTls, Simulator, StartError};
pub use world::{KEEPALIVE_TIMEOUT_MS, SPOT_INTERRUPTION_DEADLINE_MS};
