//! The command lines as people run them: `standalone` and `demo` against the
//! simulator, the configuration reference and the README's commands against
//! the types and the end-to-end run, and a release's krew manifest.

mod demo;
mod krew_manifest;
mod readme_config;
mod rules;
mod standalone;

#[path = "../support/sim.rs"]
mod sim_support;
