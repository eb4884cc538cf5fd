//! Code generated from `proto/` by `build.rs` (prost + tonic). Nothing here is
//! written by hand; conversions to the domain model live in `wire`. The
//! module tree mirrors the protobuf packages, as the generated code expects.

#![allow(clippy::all, missing_docs)]

/// `norsk.*` packages.
pub mod norsk {
    /// `norsk.api.*`: the Manager API.
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
    /// `norsk.sim.*`: the simulator's own services.
    pub mod sim {
        /// `norsk.sim.admin`
        pub mod admin {
            tonic::include_proto!("norsk.sim.admin");
        }
    }
}

pub use norsk::api::{common, manager, worker};
pub use norsk::sim::admin as sim_admin;

/// The encoded `FileDescriptorSet` of every compiled `.proto`.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/norsk_descriptor.bin"));
