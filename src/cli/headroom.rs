//! `norsk-auto-manager headroom`: resilience headroom offline. Reads the
//! same files `plan` does (pools, hot spares, a fleet snapshot, the bundles
//! whose jobs the fleet carries) and answers, for each failure domain asked
//! for (every node, zone and provider kind by default), whether its loss
//! would be absorbed: every job it carried placed again by the core's own
//! rules, or which bundles would go dark and why.
//!
//! Exit codes: 0 when every loss analysed is absorbed; 1 when one is not
//! (the report says which and why); 2, with nothing analysed, when an input
//! cannot be read or decoded, or a domain asked for is not in the fleet.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::model::{BundleId, BundleSpec, FleetSnapshot, HotSpareSpec, PlacementPool};
use crate::placement::headroom::{Context, Domain, DomainKind, Headroom, HeadroomError, HeadroomReport, Selection};

use super::plan::{InputError, Inputs, InvalidSettings, Output, input};

pub mod render;

/// Which domains to analyse: the flags of `headroom` (none: every node,
/// zone and provider kind).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct DomainArgs {
    /// The loss of this node (repeatable).
    #[arg(long = "node", id = "lost_nodes", value_name = "NODE")]
    pub nodes: Vec<String>,
    /// The loss of this availability zone (repeatable).
    #[arg(long = "zone", id = "lost_zones", value_name = "ZONE")]
    pub zones: Vec<String>,
    /// The loss of this tier, as `POOL/TIER`: its nodes and its capacity
    /// (repeatable).
    #[arg(long = "tier", id = "lost_tiers", value_name = "POOL/TIER")]
    pub tiers: Vec<String>,
    /// The loss of this provider kind (`aws`, `oci`, `local-servers`): its
    /// nodes and its tiers' capacity (repeatable).
    #[arg(long = "provider", id = "lost_providers", value_name = "KIND")]
    pub providers: Vec<String>,
    /// The loss of this pool: its nodes and its capacity (repeatable).
    #[arg(long = "pool", id = "lost_pools", value_name = "POOL")]
    pub pools: Vec<String>,
    /// Every domain of these kinds (`node`, `zone`, `tier`, `provider`,
    /// `pool`; repeatable).
    #[arg(long = "all", id = "lost_kinds", value_name = "KIND", value_enum)]
    pub all: Vec<DomainKind>,
}

impl DomainArgs {
    /// The selection the flags make.
    pub fn selection(&self) -> Selection {
        let named = [
            (DomainKind::Node, &self.nodes),
            (DomainKind::Zone, &self.zones),
            (DomainKind::Tier, &self.tiers),
            (DomainKind::Provider, &self.providers),
            (DomainKind::Pool, &self.pools),
        ];
        let domains: Vec<Domain> = named
            .iter()
            .flat_map(|(kind, names)| names.iter().map(|n| Domain::new(*kind, n.clone())))
            .collect();
        match (domains.is_empty(), self.all.is_empty()) {
            (true, true) => Selection::watched(),
            (true, false) => Selection::Kinds(self.all.clone()),
            _ => Selection::Domains(domains),
        }
    }
}

/// Arguments of `headroom`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pools, hot spares and fleet.
    #[command(flatten)]
    pub inputs: Inputs,
    /// `Bundle` documents: the specs of the bundles the fleet's jobs belong
    /// to (a job of a bundle not given cannot be placed again).
    pub bundles: Vec<PathBuf>,
    /// The domains to take away.
    #[command(flatten)]
    pub domains: DomainArgs,
    /// `table`, `wide` (every lost job's fate), `json` or `yaml`.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Trace every placement that finds nowhere and print it.
    #[arg(long)]
    pub explain: bool,
}

/// Why no analysis could be made.
#[derive(Debug, thiserror::Error)]
pub enum HeadroomCommandError {
    /// An input file could not be read.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The pools or hot spares are invalid.
    #[error(transparent)]
    Settings(#[from] InvalidSettings),
    /// The fleet snapshot is inconsistent, or a domain is not in it.
    #[error("{}: {source}", file.display())]
    Fleet {
        /// The fleet file (or where the fleet came from).
        file: PathBuf,
        /// Why.
        source: HeadroomError,
    },
    /// The report could not be rendered.
    #[error("cannot render the report: {0}")]
    Render(#[from] serde_json::Error),
}

/// Runs `headroom` and prints its report.
pub async fn run(args: Args) -> ExitCode {
    match report_of(&args) {
        Ok(report) => {
            print!(
                "{}",
                match render::render(&report, args.output, args.explain) {
                    Ok(text) => text,
                    Err(error) => {
                        eprintln!("headroom: cannot render the report: {error}");
                        return ExitCode::from(2);
                    }
                }
            );
            if report.domains.iter().all(|d| d.absorbed) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(error) => input::failed("headroom", &error),
    }
}

/// Reads the inputs and analyses the domains asked for: everything
/// `headroom` does but printing.
pub fn report_of(args: &Args) -> Result<HeadroomReport, HeadroomCommandError> {
    let (pools, hot_spares, fleet) = args.inputs.read()?;
    let mut bundles = BTreeMap::new();
    for file in &args.bundles {
        bundles.extend(input::read_bundles(file)?);
    }
    let files = args.inputs.settings_files();
    analyse(
        pools,
        &hot_spares,
        &fleet,
        &bundles,
        &args.domains.selection(),
        args.explain,
        (&files, &args.inputs.fleet),
    )
}

/// Analyses `selection` of `fleet`: the computation `headroom` and
/// `kubectl norsk headroom` share. `sources` names the settings and the
/// fleet for error messages.
pub fn analyse(
    pools: Vec<PlacementPool>,
    hot_spares: &[HotSpareSpec],
    fleet: &FleetSnapshot,
    bundles: &BTreeMap<BundleId, BundleSpec>,
    selection: &Selection,
    explain: bool,
    sources: (&str, &PathBuf),
) -> Result<HeadroomReport, HeadroomCommandError> {
    let pools = input::validated(pools, hot_spares, sources.0)?;
    let names: Vec<String> = pools.iter().map(|p| p.name.clone()).collect();
    let fleet_error = |source| HeadroomCommandError::Fleet {
        file: sources.1.clone(),
        source,
    };
    let mut headroom = Headroom::new(fleet, pools).map_err(fleet_error)?;
    let none = BTreeSet::new();
    let context = Context {
        bundles,
        at_restart_ceiling: &none,
    };
    let verdicts = headroom.analyse(context, selection, explain).map_err(fleet_error)?;
    Ok(HeadroomReport::of(verdicts, &names))
}
