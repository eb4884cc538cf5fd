//! Reading `plan`'s input files: multi-document YAML of the operator's
//! resources (`PlacementPool`, `HotSparePolicy`, `Bundle`) and a fleet
//! snapshot (YAML or JSON), decoded as strictly as the API server admits
//! the resources (see [`crate::cli::documents`]): an unknown field, a wrong
//! type, a missing field or a value outside the schema refuses the file.
//! Every failure names the file, the document (1-based), the field and its
//! line.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::cli::documents::{self, DocumentError, Kind, Problem, Resource};
use crate::model::{BundleId, BundleSpec, FleetSnapshot, HotSpareSpec, PlacementPool};
use crate::placement::{Pools, SettingsValidationError, validate_settings};

/// The settings and the fleet `plan` and `headroom` compute with.
#[derive(Clone, Debug, clap::Args)]
pub struct Inputs {
    /// `PlacementPool` documents (multi-document YAML).
    #[arg(long)]
    pub pools: PathBuf,
    /// `HotSparePolicy` documents (multi-document YAML).
    #[arg(long)]
    pub hot_spares: Option<PathBuf>,
    /// The fleet snapshot (YAML or JSON).
    #[arg(long)]
    pub fleet: PathBuf,
}

impl Inputs {
    /// The pools, the hot spares (none without a file) and the fleet, read
    /// in that order.
    pub fn read(&self) -> Result<(Vec<PlacementPool>, Vec<HotSpareSpec>, FleetSnapshot), InputError> {
        let pools = read_pools(&self.pools)?;
        let hot_spares = match &self.hot_spares {
            Some(file) => read_hot_spares(file)?,
            None => Vec::new(),
        };
        Ok((pools, hot_spares, read_fleet(&self.fleet)?))
    }

    /// The settings files, for error messages: `pools.yaml, spares.yaml`.
    pub fn settings_files(&self) -> String {
        let mut files = self.pools.display().to_string();
        if let Some(file) = &self.hot_spares {
            files.push_str(&format!(", {}", file.display()));
        }
        files
    }
}

/// The pools or hot spares are invalid.
#[derive(Debug, thiserror::Error)]
#[error("{files}: {source}")]
pub struct InvalidSettings {
    /// The settings files (or where the settings came from).
    pub files: String,
    /// Every problem.
    pub source: SettingsValidationError,
}

/// `pools` and `hot_spares` validated together; `files` names them when
/// they are not valid.
pub fn validated(
    pools: Vec<PlacementPool>,
    hot_spares: &[HotSpareSpec],
    files: &str,
) -> Result<Pools, InvalidSettings> {
    validate_settings(pools, hot_spares).map_err(|source| InvalidSettings {
        files: files.to_owned(),
        source,
    })
}

/// Prints `error` a line at a time after `command: `; exit code 2 (nothing
/// computed).
pub fn failed(command: &str, error: &dyn std::error::Error) -> std::process::ExitCode {
    for line in error.to_string().lines() {
        eprintln!("{command}: {line}");
    }
    std::process::ExitCode::from(2)
}

/// Why an input file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be opened or read.
    #[error("{}: cannot read the file: {source}", file.display())]
    Unreadable {
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Documents are not valid YAML or do not match their kind.
    #[error("{}", Refused { file, errors })]
    Documents {
        file: PathBuf,
        /// Every refused document.
        errors: Vec<DocumentError>,
    },
}

struct Refused<'a> {
    file: &'a Path,
    errors: &'a [DocumentError],
}

impl fmt::Display for Refused<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}: {error}", self.file.display())?;
        }
        Ok(())
    }
}

/// A bundle read from a file, with where it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct BundleDocument {
    /// The bundle id (`<namespace>/<name>`).
    pub bundle_id: BundleId,
    pub spec: BundleSpec,
    pub file: PathBuf,
    /// The document, counting from 0.
    pub index: usize,
}

/// Every `PlacementPool` document of `file`, as model pools.
pub fn read_pools(file: &Path) -> Result<Vec<PlacementPool>, InputError> {
    Ok(read_resources(file, Kind::PlacementPool)?
        .into_iter()
        .filter_map(|(_, r)| match r {
            Resource::PlacementPool(pool) => Some(pool.to_model()),
            _ => None,
        })
        .collect())
}

/// Every `HotSparePolicy` document of `file`.
pub fn read_hot_spares(file: &Path) -> Result<Vec<HotSpareSpec>, InputError> {
    Ok(read_resources(file, Kind::HotSparePolicy)?
        .into_iter()
        .filter_map(|(_, r)| match r {
            Resource::HotSparePolicy(policy) => Some(policy.spec.0),
            _ => None,
        })
        .collect())
}

/// Every `Bundle` document of `file`, with its bundle id.
pub fn read_bundles(file: &Path) -> Result<Vec<(BundleId, BundleSpec)>, InputError> {
    Ok(read_bundle_documents(file)?
        .into_iter()
        .map(|b| (b.bundle_id, b.spec))
        .collect())
}

/// Every `Bundle` document of `file`, with where each is.
pub fn read_bundle_documents(file: &Path) -> Result<Vec<BundleDocument>, InputError> {
    Ok(read_resources(file, Kind::Bundle)?
        .into_iter()
        .filter_map(|(index, r)| match r {
            Resource::Bundle(bundle) => Some(BundleDocument {
                bundle_id: bundle.bundle_id(),
                spec: bundle.spec.0,
                file: file.to_owned(),
                index,
            }),
            _ => None,
        })
        .collect())
}

/// The fleet snapshot in `file` (YAML or JSON).
pub fn read_fleet(file: &Path) -> Result<FleetSnapshot, InputError> {
    let text = read(file)?;
    documents::strict::decode(&text).map_err(|problems| InputError::Documents {
        file: file.to_owned(),
        errors: vec![DocumentError {
            document: 1,
            resource: None,
            problems,
        }],
    })
}

/// The problem a bundle's validation found at `path` of its spec
/// (`jobs[1].coLocateWith`), located in its file.
pub fn bundle_problem(bundle: &BundleDocument, path: &str, message: &str) -> Problem {
    let text = std::fs::read_to_string(&bundle.file).unwrap_or_default();
    let path = documents::FieldPath::parse(path).under(&documents::FieldPath::of(&["spec"]));
    Problem::at(&text, bundle.index, path, message)
}

fn read(file: &Path) -> Result<String, InputError> {
    std::fs::read_to_string(file).map_err(|source| InputError::Unreadable {
        file: file.to_owned(),
        source,
    })
}

fn read_resources(file: &Path, kind: Kind) -> Result<Vec<(usize, Resource)>, InputError> {
    let text = read(file)?;
    documents::decode_file(&text, &[kind])
        .map(|documents| documents.into_iter().map(|d| (d.index, d.resource)).collect())
        .map_err(|errors| InputError::Documents {
            file: file.to_owned(),
            errors,
        })
}
