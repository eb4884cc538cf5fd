//! The simulated clouds: AWS and OCI regions with their availability zones
//! (domains), and the instance types (shapes) each provider sells, with the
//! vCPUs, cores, GPUs and capabilities a worker on one advertises. A
//! built-in catalogue covers the common cases; `sim --catalog FILE` replaces
//! it with a YAML or JSON file of the same shape:
//!
//! ```yaml
//! aws:
//!   regions: [{name: eu-west-1, zones: [eu-west-1a, eu-west-1b]}]
//!   instanceTypes:
//!     - {name: m5.xlarge, vcpus: 4, cores: 4, launchLimit: 64}
//!     - {name: g4dn.xlarge, vcpus: 4, cores: 4, gpu: {model: t4, count: 1},
//!        capabilities: [norsk.io/nvidia-gpu]}
//! oci:
//!   regions: [{name: eu-frankfurt-1, zones: [EU-FRANKFURT-1-AD-1]}]
//!   instanceTypes: [{name: VM.Standard2.4, vcpus: 8, cores: 8}]
//! ```
//!
//! This module only describes what exists; accounting for what is in use
//! belongs to the world.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::ProviderKind;

/// Why a catalogue could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The file could not be read.
    #[error("failed to read catalogue {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a catalogue.
    #[error("failed to parse catalogue {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: yaml_serde::Error,
    },
    /// The catalogue parsed but contradicts itself.
    #[error("invalid catalogue: {0}")]
    Invalid(String),
}

/// A CPU architecture a node reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Architecture {
    /// `x86_64`
    #[default]
    #[serde(rename = "x86_64")]
    X86_64,
    /// `aarch64`
    #[serde(rename = "aarch64")]
    Aarch64,
}

/// A region and its availability zones (OCI: availability domains).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Region {
    /// The region name (`eu-west-1`, `eu-frankfurt-1`).
    pub name: String,
    /// Its zones; a node is placed in one of them.
    pub zones: Vec<String>,
}

/// The GPUs of an instance type: `count` devices of one model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuSpec {
    /// Device model (`t4`, `a10g`).
    pub model: String,
    /// Number of devices.
    pub count: u32,
}

/// An instance type (OCI: shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceType {
    /// The type name (`m5.xlarge`, `VM.Standard2.4`).
    pub name: String,
    /// vCPUs: the node advertises this as its total capacity.
    pub vcpus: u32,
    /// Cores available for pinning.
    pub cores: u32,
    /// GPU devices, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSpec>,
    /// Capabilities a worker on it advertises.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// How many nodes of this type one region can run; absent is unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_limit: Option<u32>,
    /// Link speed of the node's one NIC.
    #[serde(default = "default_nic_mbps")]
    pub nic_mbps: u64,
    /// CPU architecture.
    #[serde(default)]
    pub architecture: Architecture,
}

fn default_nic_mbps() -> u64 {
    10_000
}

/// What one provider offers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderCatalog {
    /// Regions with their zones.
    #[serde(default)]
    pub regions: Vec<Region>,
    /// Instance types, available in every region of the provider.
    #[serde(default)]
    pub instance_types: Vec<InstanceType>,
}

impl ProviderCatalog {
    /// The region named `name`.
    pub fn region(&self, name: &str) -> Option<&Region> {
        self.regions.iter().find(|r| r.name == name)
    }

    /// The instance type named `name`.
    pub fn instance_type(&self, name: &str) -> Option<&InstanceType> {
        self.instance_types.iter().find(|t| t.name == name)
    }

    /// The region one of whose zones is `zone`.
    pub fn region_of_zone(&self, zone: &str) -> Option<&Region> {
        self.regions.iter().find(|r| r.zones.iter().any(|z| z == zone))
    }
}

/// Everything the simulated clouds offer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Catalog {
    /// Amazon EC2.
    #[serde(default)]
    pub aws: ProviderCatalog,
    /// Oracle Cloud Infrastructure.
    #[serde(default)]
    pub oci: ProviderCatalog,
}

impl Default for Catalog {
    fn default() -> Self {
        Self::builtin()
    }
}

fn region(name: &str, zones: &[&str]) -> Region {
    Region {
        name: name.to_owned(),
        zones: zones.iter().map(|z| (*z).to_owned()).collect(),
    }
}

/// A CPU-only type. Cores equal vCPUs, as in the spec's own shapes
/// ("an m5.xlarge has 4, so it advertises 4", `totalCores: 4`), so a tier's
/// `candidateInstanceTypes` and what the node advertises agree.
fn cpu_type(name: &str, vcpus: u32, launch_limit: u32, nic_mbps: u64) -> InstanceType {
    InstanceType {
        name: name.to_owned(),
        vcpus,
        cores: vcpus,
        gpu: None,
        capabilities: vec![],
        launch_limit: Some(launch_limit),
        nic_mbps,
        architecture: Architecture::X86_64,
    }
}

/// A GPU type: advertises `norsk.io/nvidia-gpu`, the capability whole-GPU
/// jobs ask for. GPUs are scarce, so their launch limits are small.
fn gpu_type(name: &str, vcpus: u32, model: &str, count: u32, launch_limit: u32) -> InstanceType {
    InstanceType {
        gpu: Some(GpuSpec {
            model: model.to_owned(),
            count,
        }),
        capabilities: vec!["norsk.io/nvidia-gpu".to_owned()],
        ..cpu_type(name, vcpus, launch_limit, 25_000)
    }
}

impl Catalog {
    /// The built-in catalogue: four AWS regions and three OCI regions with
    /// general-purpose, compute and GPU types.
    pub fn builtin() -> Self {
        let aws = ProviderCatalog {
            regions: vec![
                region("eu-west-1", &["eu-west-1a", "eu-west-1b", "eu-west-1c"]),
                region("eu-central-1", &["eu-central-1a", "eu-central-1b", "eu-central-1c"]),
                region("us-east-1", &["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"]),
                region("us-west-2", &["us-west-2a", "us-west-2b", "us-west-2c"]),
            ],
            instance_types: vec![
                cpu_type("m5.large", 2, 64, 10_000),
                cpu_type("m5.xlarge", 4, 64, 10_000),
                cpu_type("m5.2xlarge", 8, 32, 10_000),
                cpu_type("c5.2xlarge", 8, 32, 10_000),
                cpu_type("c5.4xlarge", 16, 16, 10_000),
                cpu_type("c5n.9xlarge", 36, 8, 50_000),
                gpu_type("g4dn.xlarge", 4, "t4", 1, 8),
                gpu_type("g4dn.12xlarge", 48, "t4", 4, 2),
                gpu_type("g5.xlarge", 4, "a10g", 1, 4),
            ],
        };
        let oci = ProviderCatalog {
            regions: vec![
                region(
                    "eu-frankfurt-1",
                    &["EU-FRANKFURT-1-AD-1", "EU-FRANKFURT-1-AD-2", "EU-FRANKFURT-1-AD-3"],
                ),
                region(
                    "uk-london-1",
                    &["UK-LONDON-1-AD-1", "UK-LONDON-1-AD-2", "UK-LONDON-1-AD-3"],
                ),
                region(
                    "us-ashburn-1",
                    &["US-ASHBURN-AD-1", "US-ASHBURN-AD-2", "US-ASHBURN-AD-3"],
                ),
            ],
            instance_types: vec![
                // One OCPU is two vCPUs.
                cpu_type("VM.Standard2.2", 4, 64, 2_000),
                cpu_type("VM.Standard2.4", 8, 32, 4_100),
                cpu_type("VM.Standard2.8", 16, 16, 8_200),
                cpu_type("VM.Standard.E4.Flex", 8, 32, 8_000),
                gpu_type("VM.GPU3.1", 12, "v100", 1, 4),
                gpu_type("VM.GPU.A10.1", 30, "a10", 1, 4),
            ],
        };
        Self { aws, oci }
    }

    /// Reads a catalogue from a YAML or JSON file and checks it.
    pub fn load(path: &Path) -> Result<Self, CatalogError> {
        let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read {
            path: path.to_owned(),
            source,
        })?;
        let catalog: Catalog = yaml_serde::from_str(&text).map_err(|source| CatalogError::Parse {
            path: path.to_owned(),
            source,
        })?;
        catalog.validate()?;
        Ok(catalog)
    }

    /// Checks that names are unique (region names across both providers,
    /// since `capacity --region` names a region alone), that every region
    /// has a zone and every type has vCPUs.
    pub fn validate(&self) -> Result<(), CatalogError> {
        let mut regions = BTreeSet::new();
        for (kind, provider) in self.providers() {
            let mut types = BTreeSet::new();
            for region in &provider.regions {
                if !regions.insert(region.name.as_str()) {
                    return Err(invalid(format!("region {:?} is listed twice", region.name)));
                }
                if region.zones.is_empty() {
                    return Err(invalid(format!("region {:?} has no zones", region.name)));
                }
            }
            for t in &provider.instance_types {
                if !types.insert(t.name.as_str()) {
                    return Err(invalid(format!(
                        "{} instance type {:?} is listed twice",
                        kind.as_str(),
                        t.name
                    )));
                }
                if t.vcpus == 0 {
                    return Err(invalid(format!("instance type {:?} has no vCPUs", t.name)));
                }
                if t.gpu.as_ref().is_some_and(|g| g.count == 0) {
                    return Err(invalid(format!("instance type {:?} has a GPU count of 0", t.name)));
                }
            }
        }
        Ok(())
    }

    /// The provider's part of the catalogue (`None` for cluster nodes).
    pub fn provider(&self, kind: ProviderKind) -> Option<&ProviderCatalog> {
        match kind {
            ProviderKind::Aws => Some(&self.aws),
            ProviderKind::Oci => Some(&self.oci),
            ProviderKind::LocalServers => None,
        }
    }

    /// Both cloud providers with their kind.
    pub fn providers(&self) -> [(ProviderKind, &ProviderCatalog); 2] {
        [(ProviderKind::Aws, &self.aws), (ProviderKind::Oci, &self.oci)]
    }

    /// The provider that has a region named `region`.
    pub fn provider_of_region(&self, region: &str) -> Option<(ProviderKind, &ProviderCatalog)> {
        self.providers().into_iter().find(|(_, p)| p.region(region).is_some())
    }
}

fn invalid(why: String) -> CatalogError {
    CatalogError::Invalid(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_catalogue_is_valid() {
        Catalog::builtin().validate().unwrap();
    }

    #[test]
    fn an_m5_xlarge_advertises_four_vcpus_as_in_the_spec() {
        let t = Catalog::builtin().aws.instance_type("m5.xlarge").cloned().unwrap();
        assert_eq!((t.vcpus, t.cores), (4, 4));
    }

    #[test]
    fn oci_availability_domains_resolve_to_their_region() {
        let c = Catalog::builtin();
        assert_eq!(
            c.oci.region_of_zone("EU-FRANKFURT-1-AD-2").unwrap().name,
            "eu-frankfurt-1"
        );
        assert!(c.oci.region_of_zone("eu-west-1a").is_none());
    }

    #[test]
    fn a_catalogue_file_replaces_the_builtin_one() {
        let yaml = "aws:\n  regions: [{name: r1, zones: [r1a]}]\n  instanceTypes: [{name: t1, vcpus: 2, cores: 1, gpu: {model: t4, count: 2}}]\n";
        let c: Catalog = yaml_serde::from_str(yaml).unwrap();
        c.validate().unwrap();
        assert!(c.oci.regions.is_empty());
        assert_eq!(c.aws.instance_type("t1").unwrap().nic_mbps, 10_000);
    }

    #[test]
    fn a_region_without_zones_or_a_duplicate_region_is_refused() {
        let mut c = Catalog::builtin();
        c.aws.regions[0].zones.clear();
        assert!(c.validate().is_err());
        let mut c = Catalog::builtin();
        c.oci.regions.push(c.aws.regions[0].clone());
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_misspelt_field_is_refused() {
        let yaml = "aws:\n  regions: [{name: r1, zone: [r1a]}]\n";
        assert!(yaml_serde::from_str::<Catalog>(yaml).is_err());
    }
}
