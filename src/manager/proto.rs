//! Code generated from `proto/` by `build.rs` (prost + tonic). Nothing here is
//! written by hand; conversions to the domain model live in `wire.rs`.

#![allow(clippy::all, missing_docs)]

/// The generated packages, nested as their proto packages are
/// (`norsk.sim.admin` refers to `norsk.api.manager` as
/// `super::super::api::manager`).
pub mod norsk {
    /// `norsk.api.*`
    pub mod api {
        /// `norsk.api.common`
        pub mod common {
            tonic::include_proto!("norsk.api.common");
        }

        /// `norsk.api.worker`
        pub mod worker {
            tonic::include_proto!("norsk.api.worker");
        }

        /// `norsk.api.manager`
        pub mod manager {
            tonic::include_proto!("norsk.api.manager");
        }
    }

    /// `norsk.sim.*`
    pub mod sim {
        /// `norsk.sim.admin` — the simulator's admin service.
        pub mod admin {
            tonic::include_proto!("norsk.sim.admin");
        }
    }
}

pub use norsk::api::{common, manager, worker};
pub use norsk::sim::admin as sim_admin;

/// The encoded `FileDescriptorSet` of every compiled `.proto`.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/norsk_descriptor.bin"));
