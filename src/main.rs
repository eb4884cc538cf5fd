use std::process::ExitCode;

use clap::Parser;
use norsk_auto_manager::cli::{self, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    cli::run(Cli::parse()).await
}
