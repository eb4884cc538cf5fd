//! norsk-auto-manager: placement policy for fleets of Norsk live-video
//! workers.
//!
//! Layering is one-way: [`model`] <- `placement` <- `automanager` <-
//! ([`manager`], `controller`, [`cli`]). The model never imports `kube`,
//! `tonic`, `tokio` or a clock.

pub mod automanager;
pub mod backoff;
pub mod cli;
pub mod controller;
pub mod crd;
pub mod decide;
pub mod manager;
pub mod model;
pub mod placement;
pub mod plugin;
pub mod sim;
pub mod telemetry;
