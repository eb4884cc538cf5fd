//! `kubectl norsk`: the kubectl plugin (see [`norsk_auto_manager::plugin`]).

use std::process::ExitCode;

use clap::Parser;
use norsk_auto_manager::plugin::{self, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    plugin::main(Cli::parse()).await
}
