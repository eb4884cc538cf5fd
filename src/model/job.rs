//! What a job needs from a node, and how it behaves when it fails.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `onRuntimeFailure`: three behaviours, not a ranking.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnRuntimeFailure {
    /// Re-place; an unconsumed spare ranks first among equals (below warmth).
    /// The default: hot spares exist to take recovering jobs.
    #[default]
    PreferSpare,
    /// Re-place; an unconsumed spare ranks below every ordinary node.
    AvoidSpare,
    /// Do not re-place: the runtime is terminal.
    Drop,
}

/// The bundle's `onLaunch`: whether a first placement may take an unconsumed
/// hot spare.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnLaunch {
    /// Spares rank below every ordinary node (the default).
    #[default]
    AvoidSpare,
    /// Lifts the penalty without adding a preference.
    AllowSpare,
}

/// `startMode` of a bundle job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum StartMode {
    /// Placed as soon as the bundle exists (the default, and what a bundle
    /// that predates the field reads as).
    #[default]
    Auto,
    /// Expanded but dormant until `startBundleJob`.
    Manual,
}

super::string_enum! {
    /// How a job moves from one node to another (`migrateJob`'s `strategy`).
    /// A job may declare the one it supports (`requirements.migrationStrategy`);
    /// a drain or an interruption uses that declaration when its caller names
    /// no strategy for the job.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum MigrationStrategy {
        /// The target is created without starting (`deferStart`), the source
        /// stopped, the prepared target started. Never two running at once; a
        /// gap of one container start. No job cooperation. The default.
        #[default]
        StopThenStart,
        /// The target started, and once running the source stopped. Both run
        /// for a moment. No job cooperation.
        Overlap,
        /// Cooperative: the target signals ready (with an opaque payload), the
        /// source stops output at that point and reports where, the target
        /// applies from there and confirms; only then is the source stopped.
        Handover,
    }
}

/// A transport protocol of a host port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortProtocol {
    /// `tcp`
    Tcp,
    /// `udp`
    Udp,
}

/// A `"PORT/proto"` token: a host port a job claims exclusively on its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPort {
    /// The port number (1..=65535).
    pub port: u16,
    /// `tcp` or `udp`.
    pub protocol: PortProtocol,
}

/// Why a host port token could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("host port {token:?} is not PORT/proto (PORT 1-65535, proto tcp or udp)")]
pub struct HostPortParseError {
    /// The token as given.
    pub token: String,
}

impl FromStr for HostPort {
    type Err = HostPortParseError;

    fn from_str(token: &str) -> Result<Self, Self::Err> {
        let err = || HostPortParseError {
            token: token.to_owned(),
        };
        let (port, proto) = token.split_once('/').ok_or_else(err)?;
        let port: u16 = port.parse().map_err(|_| err())?;
        if port == 0 {
            return Err(err());
        }
        let protocol = match proto {
            "tcp" => PortProtocol::Tcp,
            "udp" => PortProtocol::Udp,
            _ => return Err(err()),
        };
        Ok(HostPort { port, protocol })
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = match self.protocol {
            PortProtocol::Tcp => "tcp",
            PortProtocol::Udp => "udp",
        };
        write!(f, "{}/{proto}", self.port)
    }
}

super::string_serde!(HostPort);

impl JsonSchema for HostPort {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "HostPort".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A host port the job claims exclusively on its node, as PORT/proto (e.g. 1935/tcp).",
            "pattern": "^([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])/(tcp|udp)$"
        })
    }
}

/// `requirements`: what placement must honour for a job.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct Requirements {
    /// vCPUs consumed (capacity is vCPUs: an m5.xlarge has 4).
    #[schemars(range(min = 0))]
    pub required_capacity: f64,
    /// Integer core count pinned; 0 means no pin.
    pub required_cores: u32,
    /// Hardware/software capabilities the node must advertise.
    pub required_capabilities: Vec<String>,
    /// Host ports (`PORT/proto`), exclusive per node.
    pub required_host_ports: Vec<HostPort>,
    /// Fraction of one GPU device; 0 means no GPU.
    #[schemars(range(min = 0))]
    pub required_gpu_capacity: f64,
    /// GPU model the device must be, when set.
    pub required_gpu_model: Option<String>,
    /// What happens when the job fails at runtime (default `preferSpare`).
    pub on_runtime_failure: OnRuntimeFailure,
    /// Restart ceiling per trailing hour for this job; overrides
    /// `failurePolicies` and the settings default.
    pub max_restarts_per_hour: Option<u32>,
    /// Whether losing this job ends the whole production (absent = true).
    pub essential: Option<bool>,
    /// The migration strategy the job supports (`handover` only for a job
    /// that cooperates, `overlap` for one that may briefly run twice).
    /// Drains and interruptions move the job with it when their caller
    /// names no strategy for the job, and `migrateJob` when it is given
    /// none; absent means `stopThenStart`, the spec's default. Precedence:
    /// the caller's per-job strategy (`strategyFor`), the caller's default,
    /// this declaration, `stopThenStart`.
    pub migration_strategy: Option<MigrationStrategy>,
}

impl Requirements {
    /// `essential`, absent meaning true.
    pub fn is_essential(&self) -> bool {
        self.essential.unwrap_or(true)
    }

    /// The strategy to move the job with when the caller gives `given`:
    /// the caller's, else the job's declared one, else `stopThenStart`.
    pub fn migration_strategy_or(&self, given: Option<MigrationStrategy>) -> MigrationStrategy {
        given.or(self.migration_strategy).unwrap_or_default()
    }
}

/// One job of a bundle (`BundleJobSpec`): the atomic placeable unit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.singleUse) || !self.singleUse || (has(self.exclusive) && self.exclusive)",
     "message": "singleUse requires exclusive: true"},
    {"rule": "!has(self.startedReplicas) || size(self.startedReplicas) == 0 || (has(self.startMode) && self.startMode == 'manual')",
     "message": "startedReplicas is for startMode: manual jobs (an auto job runs whenever its bundle does)"}
]))]
pub struct JobSpec {
    /// Unique within the bundle.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub job_name: String,
    /// The product template the job runs; warmth is scored against its images.
    #[serde(default)]
    pub template: String,
    /// What placement must honour.
    #[serde(default)]
    pub requirements: Requirements,
    /// Jobs of the same replica that must share this job's node (hard).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 63)))]
    pub co_locate_with: Vec<String>,
    /// Jobs of the same replica that must not share this job's node (hard).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 63)))]
    pub separate_from: Vec<String>,
    /// A node of its own (co-located peers excepted).
    #[serde(default)]
    pub exclusive: bool,
    /// Terminate the node when the job ends (requires `exclusive`;
    /// provisioned cloud nodes only).
    #[serde(default)]
    pub single_use: bool,
    /// `auto` (default) or `manual` (dormant until started).
    #[serde(default)]
    pub start_mode: StartMode,
    /// A `manual` job's replicas that should run (0 the primary, 1 the
    /// backup): the desired state `startBundleJob` / `stopBundleJob` bring
    /// Manager to. Adding a replica starts it; removing it stops it, its
    /// running instance included. Changing only this is not a revision of
    /// the bundle: restart histories and a broken mark are kept and running
    /// jobs are not touched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2), inner(range(max = 1)), extend("x-kubernetes-list-type" = "set"))]
    pub started_replicas: Vec<u32>,
    /// Job parameters passed to the template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_tokens_round_trip() {
        let port: HostPort = "1935/tcp".parse().unwrap();
        assert_eq!(
            port,
            HostPort {
                port: 1935,
                protocol: PortProtocol::Tcp
            }
        );
        assert_eq!(port.to_string(), "1935/tcp");
        assert_eq!("5000/udp".parse::<HostPort>().unwrap().protocol, PortProtocol::Udp);
    }

    #[test]
    fn malformed_host_ports_are_refused() {
        for bad in ["", "1935", "1935/sctp", "0/tcp", "70000/tcp", "abc/tcp", "/tcp"] {
            assert!(bad.parse::<HostPort>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn the_migration_strategy_schema_lists_every_serde_name() {
        let schema = schemars::schema_for!(MigrationStrategy);
        let listed: Vec<String> = schema
            .get("oneOf")
            .and_then(|v| v.as_array())
            .unwrap()
            .iter()
            .map(|v| v["const"].as_str().unwrap().to_owned())
            .collect();
        let named: Vec<String> = [
            MigrationStrategy::StopThenStart,
            MigrationStrategy::Overlap,
            MigrationStrategy::Handover,
        ]
        .iter()
        .map(|s| serde_json::to_value(s).unwrap().as_str().unwrap().to_owned())
        .collect();
        assert_eq!(listed, named);
    }

    #[test]
    fn a_declared_strategy_yields_to_the_callers_and_defaults_to_stop_then_start() {
        let none = Requirements::default();
        assert_eq!(none.migration_strategy_or(None), MigrationStrategy::StopThenStart);
        let declared = Requirements {
            migration_strategy: Some(MigrationStrategy::Overlap),
            ..Default::default()
        };
        assert_eq!(declared.migration_strategy_or(None), MigrationStrategy::Overlap);
        assert_eq!(
            declared.migration_strategy_or(Some(MigrationStrategy::Handover)),
            MigrationStrategy::Handover
        );
    }

    #[test]
    fn essential_defaults_to_true() {
        assert!(Requirements::default().is_essential());
        let r = Requirements {
            essential: Some(false),
            ..Default::default()
        };
        assert!(!r.is_essential());
    }
}
