//! `norsk-auto-manager sim`: serve the Manager simulator.

use std::process::ExitCode;

/// Arguments of `sim`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the simulator until interrupted.
pub async fn run(_args: Args) -> ExitCode {
    ExitCode::FAILURE
}
