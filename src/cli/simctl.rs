//! `norsk-auto-manager simctl`: the simulator admin CLI.

use std::process::ExitCode;

/// Arguments of `simctl`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs one admin command.
pub async fn run(_args: Args) -> ExitCode {
    ExitCode::FAILURE
}
