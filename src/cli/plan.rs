//! `norsk-auto-manager plan`: an offline dry run. Reads the operator's
//! resource documents (pools, hot spares, bundles) and a fleet snapshot,
//! places every replica of every bundle in file order, each placement
//! seeing those before it, and prints the plan.
//!
//! Input is decoded as strictly as the API server admits the same
//! resources (unknown fields, wrong types, missing fields and values
//! outside the schema are refused). Exit codes: 0 when the plan was
//! computed and every bundle is valid, whatever the placements found; 1
//! when the plan was computed but a bundle is invalid (its rows are
//! `invalid`, and stderr names each bundle, its file, document, field and
//! line — the operator would refuse it); 2, with nothing planned, when an
//! input cannot be read or decoded (stderr names the file, document, field
//! and line).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::model::{BundleId, BundleSpec, FleetSnapshot, HotSpareSpec, PlacementPool};
use crate::placement::{FleetError, FleetView, PlanError, PlanRow, SequentialNodeIds, plan_bundles};

pub mod input;
pub(crate) mod render;

pub use input::{InputError, Inputs, InvalidSettings};

/// How the plan is printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A table for people.
    #[default]
    Table,
    /// The table with where each job runs now and whether the plan moves
    /// it (read from the fleet's reservations).
    Wide,
    /// The JSON document (`{"placements": [...]}`).
    Json,
    /// The same document in YAML.
    Yaml,
}

/// Arguments of `plan`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pools, hot spares and fleet.
    #[command(flatten)]
    pub inputs: Inputs,
    /// `Bundle` documents, placed in file order.
    #[arg(required = true)]
    pub bundles: Vec<PathBuf>,
    /// `table` or `json`.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Record each placement's trace (every node's rejection or key) and
    /// print it.
    #[arg(long)]
    pub explain: bool,
}

/// Why no plan could be computed.
#[derive(Debug, thiserror::Error)]
pub enum PlanCommandError {
    /// An input file could not be read.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The pools or hot spares are invalid.
    #[error(transparent)]
    Settings(#[from] InvalidSettings),
    /// The fleet snapshot is inconsistent.
    #[error("{}: {source}", file.display())]
    Fleet {
        /// The fleet file.
        file: PathBuf,
        /// Why.
        source: FleetError,
    },
    /// Planning failed.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The JSON could not be written.
    #[error("cannot render the plan as JSON: {0}")]
    Render(#[from] serde_json::Error),
}

/// Runs `plan` and prints its output.
pub async fn run(args: Args) -> ExitCode {
    match plan_report(&args) {
        Ok(report) => {
            print!("{}", report.text);
            for invalid in &report.invalid {
                eprintln!("plan: {invalid}");
            }
            if report.invalid.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(error) => input::failed("plan", &error),
    }
}

/// What `plan` computed: the rendered plan and every invalid bundle.
#[derive(Clone, Debug)]
pub struct PlanReport {
    /// The plan as `args.output` asks.
    pub text: String,
    /// One line per invalid bundle: its file, document, id and every
    /// validation error with its field and line.
    pub invalid: Vec<String>,
}

/// Reads the inputs, computes the plan and renders it as `args.output`
/// asks: everything `plan` does except printing.
pub fn plan_output(args: &Args) -> Result<String, PlanCommandError> {
    plan_report(args).map(|report| report.text)
}

/// [`plan_output`] with the bundles validation refused.
pub fn plan_report(args: &Args) -> Result<PlanReport, PlanCommandError> {
    let (pools, hot_spares, fleet) = args.inputs.read()?;
    let mut documents = Vec::new();
    for file in &args.bundles {
        documents.extend(input::read_bundle_documents(file)?);
    }
    let bundles: Vec<(BundleId, BundleSpec)> = documents
        .iter()
        .map(|d| (d.bundle_id.clone(), d.spec.clone()))
        .collect();
    let sources = Sources {
        settings: args.inputs.settings_files(),
        fleet: args.inputs.fleet.clone(),
    };
    let rows = plan_rows(pools, &hot_spares, &fleet, &bundles, args.explain, &sources)?;
    Ok(PlanReport {
        text: render_rows(&rows, args.output, &fleet)?,
        invalid: invalid_bundles(&documents, &rows),
    })
}

/// Each bundle the plan found invalid, once, in input order.
fn invalid_bundles(documents: &[input::BundleDocument], rows: &[PlanRow]) -> Vec<String> {
    documents
        .iter()
        .filter_map(|document| {
            let row = rows
                .iter()
                .find(|r| r.bundle == document.bundle_id && !r.errors.is_empty())?;
            let problems: Vec<String> = row
                .errors
                .iter()
                .map(|issue| input::bundle_problem(document, &issue.path, &issue.message).to_string())
                .collect();
            Some(format!(
                "{}: document {} (Bundle {}): invalid: {}",
                document.file.display(),
                document.index + 1,
                document.bundle_id,
                problems.join("; ")
            ))
        })
        .collect()
}

/// Where a plan's inputs came from, for error messages.
#[derive(Clone, Debug)]
pub struct Sources {
    /// The pools and hot spares (files, or the cluster).
    pub settings: String,
    /// The fleet snapshot.
    pub fleet: PathBuf,
}

/// Places every replica of `bundles`, in order, on `fleet` with `pools` and `hot_spares`:
/// the computation `plan` and `kubectl norsk plan` share.
pub fn plan_rows(
    pools: Vec<PlacementPool>,
    hot_spares: &[HotSpareSpec],
    fleet: &FleetSnapshot,
    bundles: &[(BundleId, BundleSpec)],
    explain: bool,
    sources: &Sources,
) -> Result<Vec<PlanRow>, PlanCommandError> {
    let pools = input::validated(pools, hot_spares, &sources.settings)?;
    let mut view = FleetView::new(fleet, pools).map_err(|source| PlanCommandError::Fleet {
        file: sources.fleet.clone(),
        source,
    })?;
    Ok(plan_bundles(
        &mut view,
        bundles,
        explain,
        &mut SequentialNodeIds::default(),
    )?)
}

/// The plan as `output` asks.
/// `rows` as `output`; `fleet` is what `wide` reads the jobs' current
/// nodes from (the fleet as it is, before any reservation is set aside).
pub fn render_rows(rows: &[PlanRow], output: Output, fleet: &FleetSnapshot) -> Result<String, PlanCommandError> {
    Ok(match output {
        Output::Table => render::table(rows),
        Output::Wide => render::wide(rows, &render::current_nodes(fleet)),
        Output::Json => render::json(rows)?,
        Output::Yaml => render::yaml(rows)?,
    })
}
