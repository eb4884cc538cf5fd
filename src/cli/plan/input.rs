//! Reading `plan`'s input files: multi-document YAML of the operator's
//! resources (`PlacementPool`, `HotSparePolicy`, `Bundle`) and a fleet
//! snapshot (YAML or JSON). Every failure names the file, the document
//! (1-based) and the field.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::crd::{self, API_VERSION};
use crate::model::{BundleId, BundleSpec, FleetSnapshot, HotSpareSpec, PlacementPool};

/// Why an input file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be opened or read.
    #[error("{}: cannot read the file: {source}", file.display())]
    Unreadable {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A document is not valid YAML or does not match its kind's shape.
    #[error("{}: document {document}: {message}", file.display())]
    Document {
        /// The file.
        file: PathBuf,
        /// The document, counting from 1.
        document: usize,
        /// The field and what is wrong with it.
        message: String,
    },
}

/// The resource kinds `plan` reads.
trait Kind: DeserializeOwned + kube::Resource {
    const KIND: &'static str;
}

impl Kind for crd::PlacementPool {
    const KIND: &'static str = "PlacementPool";
}

impl Kind for crd::HotSparePolicy {
    const KIND: &'static str = "HotSparePolicy";
}

impl Kind for crd::Bundle {
    const KIND: &'static str = "Bundle";
}

/// Every `PlacementPool` document of `file`, as model pools.
pub fn read_pools(file: &Path) -> Result<Vec<PlacementPool>, InputError> {
    let pools: Vec<crd::PlacementPool> = read_documents(file)?;
    Ok(pools.iter().map(crd::PlacementPool::to_model).collect())
}

/// Every `HotSparePolicy` document of `file`.
pub fn read_hot_spares(file: &Path) -> Result<Vec<HotSpareSpec>, InputError> {
    let policies: Vec<crd::HotSparePolicy> = read_documents(file)?;
    Ok(policies.into_iter().map(|p| p.spec.0).collect())
}

/// Every `Bundle` document of `file`, with its bundle id.
pub fn read_bundles(file: &Path) -> Result<Vec<(BundleId, BundleSpec)>, InputError> {
    let bundles: Vec<crd::Bundle> = read_documents(file)?;
    Ok(bundles.into_iter().map(|b| (b.bundle_id(), b.spec.0)).collect())
}

/// The fleet snapshot in `file` (YAML or JSON).
pub fn read_fleet(file: &Path) -> Result<FleetSnapshot, InputError> {
    let text = read(file)?;
    FleetSnapshot::deserialize(serde_yaml::Deserializer::from_str(&text))
        .map_err(|e| document_error(file, 1, e.to_string()))
}

fn read(file: &Path) -> Result<String, InputError> {
    std::fs::read_to_string(file).map_err(|source| InputError::Unreadable {
        file: file.to_owned(),
        source,
    })
}

fn document_error(file: &Path, document: usize, message: String) -> InputError {
    InputError::Document {
        file: file.to_owned(),
        document,
        message,
    }
}

/// Reads every non-empty document of `file` as a `K`. The documents are
/// walked twice: once as plain values to check `apiVersion` and `kind`, once
/// typed, so a shape error names the field path and line.
fn read_documents<K: Kind>(file: &Path) -> Result<Vec<K>, InputError> {
    let text = read(file)?;
    let mut values = Vec::new();
    for (i, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = serde_yaml::Value::deserialize(document).map_err(|e| document_error(file, i + 1, e.to_string()))?;
        values.push(value);
    }
    let mut resources = Vec::new();
    for (i, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let number = i + 1;
        let Some(value) = values.get(i) else { break };
        if value.is_null() {
            continue;
        }
        check_type(value, K::KIND).map_err(|message| document_error(file, number, message))?;
        let resource = K::deserialize(document).map_err(|e| document_error(file, number, e.to_string()))?;
        if resource.meta().name.as_deref().is_none_or(str::is_empty) {
            return Err(document_error(file, number, "metadata.name: missing".to_owned()));
        }
        resources.push(resource);
    }
    Ok(resources)
}

fn check_type(value: &serde_yaml::Value, kind: &str) -> Result<(), String> {
    let field = |name: &str| value.get(name).and_then(serde_yaml::Value::as_str);
    match field("apiVersion") {
        Some(API_VERSION) => {}
        Some(other) => {
            return Err(format!("apiVersion: expected {API_VERSION}, found {other:?}"));
        }
        None => return Err(format!("apiVersion: missing (expected {API_VERSION})")),
    }
    match field("kind") {
        Some(found) if found == kind => Ok(()),
        Some(other) => Err(format!("kind: expected {kind}, found {other:?}")),
        None => Err(format!("kind: missing (expected {kind})")),
    }
}
