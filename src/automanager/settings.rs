//! `AutoSettings`: the operator-wide settings the core runs with, their
//! spec defaults, and their validation at start. Every problem is listed at
//! once (the seed's `AutoSettingsValidationError`), the pool and hot-spare
//! checks being the placement engine's own ([`validate_settings`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::{HotSpareSpec, OnRuntimeFailure, PlacementPool, Requirements};
use crate::placement::{Pools, SettingsErrorCode, validate_settings};

use super::migration::settings::MigrationSettings;
use super::node_services::state::{EAGER_LIFECYCLE, NodeServiceSpec};

/// The flat restart ceiling when nothing more specific is configured.
pub const DEFAULT_MAX_RESTARTS_PER_HOUR: u32 = 6;
/// `rejectionEscalationCount` default.
pub const DEFAULT_REJECTION_ESCALATION_COUNT: u32 = 3;
/// `rejectionBackoffMs` default.
pub const DEFAULT_REJECTION_BACKOFF_MS: u64 = 5_000;
/// `unhealthyCooldownMs` default (10 min).
pub const DEFAULT_UNHEALTHY_COOLDOWN_MS: u64 = 10 * 60_000;
/// `hotSpareReconcileIntervalMs` default: the hot-spare reconciler's
/// periodic tick (60 s).
pub const DEFAULT_HOT_SPARE_RECONCILE_INTERVAL_MS: u64 = 60_000;

/// One `failurePolicies` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct FailurePolicy {
    /// The restart ceiling of jobs with this policy, per trailing hour.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_restarts_per_hour: Option<u32>,
}

/// `failurePolicies`: a ceiling per re-placing policy (`drop` never
/// restarts, so it has none).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct FailurePolicies {
    /// For `onRuntimeFailure: preferSpare`.
    pub prefer_spare: FailurePolicy,
    /// For `onRuntimeFailure: avoidSpare`.
    pub avoid_spare: FailurePolicy,
}

/// The settings the core runs with (the seed's `AutoSettings`; durations in
/// seconds where the seed has seconds, `...Ms` in milliseconds). A key this
/// build does not know is refused, so a typo never passes silently.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct AutoSettings {
    /// Manager's address (`host:port` or a URL).
    pub url: String,
    /// Seconds ahead of their window Manager reports jobs as pending.
    pub pending_window: u32,
    /// Seconds a stopped node is kept before the sweep removes it.
    pub remove_stopped_nodes_after: u64,
    /// Ordered tiers per pool.
    pub placement_pools: Vec<PlacementPool>,
    /// Hot-spare targets per pool.
    pub hot_spares: Vec<HotSpareSpec>,
    /// Restart ceilings per failure policy.
    pub failure_policies: FailurePolicies,
    /// The flat restart ceiling (default 6).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_restarts_per_hour: Option<u32>,
    /// Rejections inside `rejectionBackoffMs` that make a node unhealthy.
    pub rejection_escalation_count: u32,
    /// The window rejections are counted in.
    pub rejection_backoff_ms: u64,
    /// How long an unhealthy node stays excluded without a job reaching
    /// running on it.
    pub unhealthy_cooldown_ms: u64,
    /// Template name -> image references: what warmth is scored against.
    pub template_images: BTreeMap<String, Vec<String>>,
    /// Whether `placementDecision` carries the full trace (every node's
    /// filter verdict). On by default: the spec's `onPlacementDecision`
    /// "carries the full trace". Recording a verdict per node costs about
    /// 300 µs per placement on a 5,000-node fleet, and a traced placement
    /// scans every node (an untraced one searches the candidate index), so
    /// fleets of more than a few hundred nodes should turn it off;
    /// `placeDryRun` and `plan --trace` still show the trace on request.
    pub trace_placements: bool,
    /// The hot-spare reconciler's periodic tick (default 60 s).
    pub hot_spare_reconcile_interval_ms: u64,
    /// Services placed eagerly on every node they apply to (experimental:
    /// needs `experimental: { nodeServices: true }`).
    pub node_services: Vec<NodeServiceSpec>,
    /// Features that must be switched on explicitly.
    pub experimental: Experimental,
    /// The migration saga's phase deadlines.
    pub migration: MigrationSettings,
}

/// `experimental`: features that exist only in part, so nobody configures
/// one by accident.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Experimental {
    /// Allows a non-empty `nodeServices`.
    pub node_services: bool,
    /// Keeps resilience headroom continuously (`headroomChanged`, the
    /// Bundle `Resilient` condition, PlacementPool `status.headroom`). Off
    /// by default: each recompute runs inside the core's loop, and on a
    /// 1,000-node `binpack` fleet an update after one placement takes
    /// 75 ms (plus 209 ms for zones and providers at most every 30 s),
    /// which would delay recoveries; `norsk-auto-manager headroom` asks the
    /// same question offline at no cost to the core.
    pub headroom: bool,
}

/// The JSON schema of the `settings` a Helm release writes into the
/// operator's settings file: `AutoSettings` without what the chart fills in
/// (`url`, from `manager.url`) and what are resources there
/// (`placementPools`, `hotSpares`). The chart's `values.schema.json` holds
/// this so a typo fails `helm install` instead of the operator's start.
pub fn chart_settings_schema() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft07()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut schema = serde_json::to_value(generator.into_root_schema_for::<AutoSettings>()).unwrap_or_default();
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object.remove("title");
        object.remove("default");
        object.insert(
            "description".to_owned(),
            "The core's settings (AutoSettings); pools and hot spares are PlacementPool and HotSparePolicy resources, the URL is manager.url".into(),
        );
        if let Some(properties) = object.get_mut("properties").and_then(|p| p.as_object_mut()) {
            for chart_owned in ["url", "placementPools", "hotSpares"] {
                properties.remove(chart_owned);
            }
        }
    }
    schema
}

impl Default for AutoSettings {
    fn default() -> Self {
        Self {
            url: String::new(),
            pending_window: 60,
            remove_stopped_nodes_after: 3600,
            placement_pools: Vec::new(),
            hot_spares: Vec::new(),
            failure_policies: FailurePolicies::default(),
            max_restarts_per_hour: None,
            rejection_escalation_count: DEFAULT_REJECTION_ESCALATION_COUNT,
            rejection_backoff_ms: DEFAULT_REJECTION_BACKOFF_MS,
            unhealthy_cooldown_ms: DEFAULT_UNHEALTHY_COOLDOWN_MS,
            template_images: BTreeMap::new(),
            trace_placements: true,
            hot_spare_reconcile_interval_ms: DEFAULT_HOT_SPARE_RECONCILE_INTERVAL_MS,
            node_services: Vec::new(),
            experimental: Experimental::default(),
            migration: MigrationSettings::default(),
        }
    }
}

impl AutoSettings {
    /// The restart ceiling of a job, in the spec's resolution order: the
    /// job's `requirements.maxRestartsPerHour`, then
    /// `failurePolicies.{preferSpare,avoidSpare}`, then the flat
    /// `maxRestartsPerHour`, then 6. `None` for `drop`, which never restarts.
    pub fn restart_ceiling(&self, requirements: &Requirements) -> Option<u32> {
        let policy = match requirements.on_runtime_failure {
            OnRuntimeFailure::PreferSpare => &self.failure_policies.prefer_spare,
            OnRuntimeFailure::AvoidSpare => &self.failure_policies.avoid_spare,
            OnRuntimeFailure::Drop => return None,
        };
        Some(
            requirements
                .max_restarts_per_hour
                .or(policy.max_restarts_per_hour)
                .or(self.max_restarts_per_hour)
                .unwrap_or(DEFAULT_MAX_RESTARTS_PER_HOUR),
        )
    }
}

/// A settings problem's stable code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub enum AutoSettingsErrorCode {
    /// A pool, tier or hot-spare problem (the placement engine's codes).
    Placement(SettingsErrorCode),
    /// One of the core's own codes.
    Core(CoreSettingsErrorCode),
}

/// The core's own settings codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum CoreSettingsErrorCode {
    /// `url` is empty: there is no Manager to connect to.
    EmptyUrl,
    /// `rejectionEscalationCount` is 0: every node would be unhealthy
    /// before its first rejection.
    ZeroRejectionEscalationCount,
    /// `rejectionBackoffMs` is 0: no two rejections could ever be counted
    /// together.
    ZeroRejectionBackoff,
    /// `hotSpareReconcileIntervalMs` is 0: the tick would never let go.
    ZeroHotSpareReconcileInterval,
    /// A non-empty `nodeServices` without `experimental: { nodeServices:
    /// true }`.
    ExperimentalNotEnabled,
    /// `nodeServices[].lifecycle` other than `eager` (the one that exists).
    UnsupportedNodeServiceLifecycle,
    /// A node service without a name or template.
    IncompleteNodeService,
    /// Two node services share a name.
    DuplicateNodeService,
    /// `nodeServices[].pools` names a pool that is not configured.
    UnknownNodeServicePool,
    /// A `migration` phase deadline is 0: every migration would expire in
    /// that phase.
    ZeroMigrationPhaseTimeout,
}

/// One settings problem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AutoSettingsIssue {
    /// The stable code.
    pub code: AutoSettingsErrorCode,
    /// Where, e.g. `placementPools[0].tiers[1].name`.
    pub path: String,
    /// What is wrong, in words a person can act on.
    pub message: String,
}

impl fmt::Display for AutoSettingsIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Settings were refused; every problem found is listed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid AutoManager settings: {}", .errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct AutoSettingsValidationError {
    /// Every problem, in the order the settings list them.
    pub errors: Vec<AutoSettingsIssue>,
}

/// Settings that passed validation, with the pools the engine runs on.
#[derive(Clone, Debug)]
pub struct ValidSettings {
    /// The settings as given.
    pub settings: AutoSettings,
    /// The validated pools.
    pub pools: Pools,
}

/// Validates `settings`, listing every problem at once.
pub fn validate_auto_settings(settings: AutoSettings) -> Result<ValidSettings, AutoSettingsValidationError> {
    let mut errors = Vec::new();
    let mut core = |code, path: &str, message: &str| {
        errors.push(AutoSettingsIssue {
            code: AutoSettingsErrorCode::Core(code),
            path: path.to_owned(),
            message: message.to_owned(),
        });
    };
    if settings.url.trim().is_empty() {
        core(CoreSettingsErrorCode::EmptyUrl, "url", "no Manager address given");
    }
    if settings.rejection_escalation_count == 0 {
        core(
            CoreSettingsErrorCode::ZeroRejectionEscalationCount,
            "rejectionEscalationCount",
            "must be at least 1 (default 3)",
        );
    }
    if settings.rejection_backoff_ms == 0 {
        core(
            CoreSettingsErrorCode::ZeroRejectionBackoff,
            "rejectionBackoffMs",
            "must be positive (default 5000)",
        );
    }
    if settings.hot_spare_reconcile_interval_ms == 0 {
        core(
            CoreSettingsErrorCode::ZeroHotSpareReconcileInterval,
            "hotSpareReconcileIntervalMs",
            "must be positive (default 60000)",
        );
    }
    for (code, path, message) in check_node_services(&settings) {
        core(code, &path, &message);
    }
    for (name, ms) in settings.migration.named() {
        if ms == 0 {
            core(
                CoreSettingsErrorCode::ZeroMigrationPhaseTimeout,
                &format!("migration.{name}"),
                "must be positive",
            );
        }
    }
    let pools = match validate_settings(settings.placement_pools.clone(), &settings.hot_spares) {
        Ok(pools) => Some(pools),
        Err(refused) => {
            errors.extend(refused.errors.into_iter().map(|issue| AutoSettingsIssue {
                code: AutoSettingsErrorCode::Placement(issue.code),
                path: issue.path,
                message: issue.message,
            }));
            None
        }
    };
    match pools {
        Some(pools) if errors.is_empty() => Ok(ValidSettings { settings, pools }),
        _ => Err(AutoSettingsValidationError { errors }),
    }
}

/// The `nodeServices` problems of `settings`, as (code, path, message).
fn check_node_services(settings: &AutoSettings) -> Vec<(CoreSettingsErrorCode, String, String)> {
    let mut found = Vec::new();
    if settings.node_services.is_empty() {
        return found;
    }
    if !settings.experimental.node_services {
        found.push((
            CoreSettingsErrorCode::ExperimentalNotEnabled,
            "nodeServices".to_owned(),
            "node services are experimental (only eager placement exists); set experimental: { nodeServices: true } to use them".to_owned(),
        ));
    }
    let mut names = BTreeMap::new();
    for (i, service) in settings.node_services.iter().enumerate() {
        let path = format!("nodeServices[{i}]");
        if service.lifecycle != EAGER_LIFECYCLE {
            found.push((
                CoreSettingsErrorCode::UnsupportedNodeServiceLifecycle,
                format!("{path}.lifecycle"),
                format!("lifecycle {:?} does not exist; only \"eager\" does", service.lifecycle),
            ));
        }
        if service.name.trim().is_empty() || service.template.trim().is_empty() {
            found.push((
                CoreSettingsErrorCode::IncompleteNodeService,
                path.clone(),
                "a node service needs a name and a template".to_owned(),
            ));
        } else if names.insert(service.name.as_str(), i).is_some() {
            found.push((
                CoreSettingsErrorCode::DuplicateNodeService,
                format!("{path}.name"),
                format!("node service {:?} is defined twice", service.name),
            ));
        }
        for (p, pool) in service.pools.iter().enumerate() {
            if !settings.placement_pools.iter().any(|known| &known.name == pool) {
                found.push((
                    CoreSettingsErrorCode::UnknownNodeServicePool,
                    format!("{path}.pools[{p}]"),
                    format!("pool {pool:?} is not configured"),
                ));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn omitted_settings_take_the_spec_defaults() {
        let s: AutoSettings = yaml_serde::from_str("url: m:6789\n").unwrap();
        assert_eq!(s.rejection_escalation_count, 3);
        assert_eq!(s.rejection_backoff_ms, 5_000);
        assert_eq!(s.unhealthy_cooldown_ms, 600_000);
        assert_eq!(s.restart_ceiling(&Requirements::default()), Some(6));
    }

    #[test]
    fn a_misspelt_setting_is_refused() {
        let refused = yaml_serde::from_str::<AutoSettings>("url: m:1\nmaxRestartPerHour: 3\n");
        assert!(refused.unwrap_err().to_string().contains("maxRestartPerHour"));
    }

    #[test]
    fn restart_ceiling_resolves_job_then_policy_then_flat_then_six() {
        let mut s = AutoSettings {
            max_restarts_per_hour: Some(4),
            ..Default::default()
        };
        let mut req = Requirements::default();
        assert_eq!(s.restart_ceiling(&req), Some(4));
        s.failure_policies.prefer_spare.max_restarts_per_hour = Some(3);
        assert_eq!(s.restart_ceiling(&req), Some(3));
        req.on_runtime_failure = OnRuntimeFailure::AvoidSpare;
        assert_eq!(s.restart_ceiling(&req), Some(4));
        req.max_restarts_per_hour = Some(1);
        assert_eq!(s.restart_ceiling(&req), Some(1));
        req.on_runtime_failure = OnRuntimeFailure::Drop;
        assert_eq!(s.restart_ceiling(&req), None);
    }

    #[test]
    fn every_settings_error_is_listed_at_once() {
        let s: AutoSettings = yaml_serde::from_str(
            "url: ''\nrejectionEscalationCount: 0\nplacementPools:\n  - {name: p, tiers: [{name: a, kind: aws}, {name: a, kind: aws}]}\nhotSpares:\n  - {pool: nowhere, targetCount: 1, spec: {instanceType: m5.xlarge}}\n",
        )
        .unwrap();
        let codes: Vec<_> = validate_auto_settings(s)
            .unwrap_err()
            .errors
            .into_iter()
            .map(|e| serde_json::to_value(e.code).unwrap())
            .collect();
        for expected in [
            "emptyUrl",
            "zeroRejectionEscalationCount",
            "duplicateTier",
            "noCandidateInstanceTypes",
            "unknownPool",
        ] {
            assert!(codes.iter().any(|c| c == expected), "{expected} missing from {codes:?}");
        }
    }
}
