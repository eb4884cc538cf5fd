//! The Manager simulator over loopback (stream order and snapshots, nodes,
//! jobs, bundles, faults, workers, the published-API-only mode, the
//! `sim`/`simctl` binaries), the Manager client and the vendor's Node client
//! against it, and the compiled descriptors against the published API.

mod bundles;
mod client;
mod faults;
mod jobs;
mod nodes;
mod proto_compat;
mod published;
mod simctl;
mod stream;
mod vendor_client;
mod workers;

#[path = "../support/sim.rs"]
mod sim_support;
