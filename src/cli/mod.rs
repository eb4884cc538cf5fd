//! The command line: one file per subcommand. `main.rs` only parses and
//! dispatches here.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod bench;
pub mod crds;
pub mod demo;
pub mod documents;
pub mod headroom;
pub mod operator;
pub mod plan;
pub mod settings_file;
pub mod sim;
pub mod simctl;
pub mod standalone;

/// Placement policy for fleets of Norsk live-video workers.
#[derive(Debug, Parser)]
#[command(name = "norsk-auto-manager", version = crate::telemetry::VERSION, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a simulated Norsk Manager (and its admin service) on loopback.
    Sim(sim::Args),
    /// Inspect and inject faults into a running simulator.
    Simctl(simctl::Args),
    /// Plan bundles against a fleet snapshot offline, with a full trace.
    Plan(plan::Args),
    /// Resilience headroom offline: would the loss of each node, zone or
    /// provider kind of a fleet snapshot be absorbed, and if not, why.
    Headroom(headroom::Args),
    /// Measure the placement engine on a synthetic fleet.
    Bench(bench::Args),
    /// Run the AutoManager against a Manager without Kubernetes: settings,
    /// pools and a bundle directory from YAML, notifications printed.
    Standalone(standalone::Args),
    /// A scripted tour against an in-process simulator: node loss, tier
    /// spill, a crash loop breaking its bundle, an invalid spec.
    Demo(demo::Args),
    /// Print (or write) the custom resource definitions.
    Crds(crds::Args),
    /// Run the Kubernetes operator: reconcile the custom resources, drive
    /// Manager, write status (one leader among replicas).
    Operator(operator::Args),
    /// Print the shell completion script: `source <(norsk-auto-manager
    /// completion bash)`.
    Completion {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// Writes `shell`'s completion script for the command `C` (named `name`) to
/// stdout.
pub fn print_completion<C: clap::CommandFactory>(shell: clap_complete::Shell, name: &str) -> ExitCode {
    let mut command = C::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut script);
    // A closed pipe (`| head`) is the reader's choice, not an error worth a panic.
    match std::io::Write::write_all(&mut std::io::stdout().lock(), &script) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write the completion script: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The exit code of a command that ended with `result`: success, or
/// failure with the error printed.
pub fn exit_code(result: Result<(), impl std::fmt::Display>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Sim(args) => sim::run(args).await,
        Command::Simctl(args) => simctl::run(args).await,
        Command::Plan(args) => plan::run(args).await,
        Command::Headroom(args) => headroom::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Standalone(args) => standalone::run(args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Crds(args) => crds::run(args).await,
        Command::Operator(args) => operator::run(args).await,
        Command::Completion { shell } => print_completion::<Cli>(shell, "norsk-auto-manager"),
    }
}
