//! The `migration` settings: one deadline per phase of the saga, with
//! their defaults, and how each phase finds its own.

use serde::{Deserialize, Serialize};

use crate::model::MigrationPhase;

/// The `migration` settings: one deadline per phase, in milliseconds. A
/// phase that outlives its deadline aborts the migration before the point
/// of no return and fails it forward after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct MigrationSettings {
    /// `placing`: the target's node provisioned and started.
    pub placing_timeout_ms: u64,
    /// `preparing`: the deferred start prepared.
    pub preparing_timeout_ms: u64,
    /// `starting`: the started target running.
    pub starting_timeout_ms: u64,
    /// `awaitingReady`: the target's `target_ready`.
    pub awaiting_ready_timeout_ms: u64,
    /// `stoppingOutput`: the source's `source_stopped_at`.
    pub stopping_output_timeout_ms: u64,
    /// `applying`: the target's `target_applied`.
    pub applying_timeout_ms: u64,
    /// `stoppingSource`: the source stopped.
    pub stopping_source_timeout_ms: u64,
    /// `startingTarget`: the prepared target running.
    pub starting_target_timeout_ms: u64,
}

/// `placingTimeoutMs` default: 10 min, the default `provisionTimeoutMs` of
/// a cloud tier (`max(placementLeadMs, 5 min) × 2`).
pub const DEFAULT_MIGRATION_PLACING_TIMEOUT_MS: u64 = 10 * 60_000;
/// Default deadline of a container start (`preparing`, `starting`,
/// `startingTarget`): 2 min.
pub const DEFAULT_MIGRATION_START_TIMEOUT_MS: u64 = 2 * 60_000;
/// Default deadline of one handover step (`awaitingReady`,
/// `stoppingOutput`, `applying`): 30 s.
pub const DEFAULT_MIGRATION_HANDOVER_STEP_TIMEOUT_MS: u64 = 30_000;
/// `stoppingSourceTimeoutMs` default: 1 min.
pub const DEFAULT_MIGRATION_STOPPING_SOURCE_TIMEOUT_MS: u64 = 60_000;

impl Default for MigrationSettings {
    fn default() -> Self {
        Self {
            placing_timeout_ms: DEFAULT_MIGRATION_PLACING_TIMEOUT_MS,
            preparing_timeout_ms: DEFAULT_MIGRATION_START_TIMEOUT_MS,
            starting_timeout_ms: DEFAULT_MIGRATION_START_TIMEOUT_MS,
            awaiting_ready_timeout_ms: DEFAULT_MIGRATION_HANDOVER_STEP_TIMEOUT_MS,
            stopping_output_timeout_ms: DEFAULT_MIGRATION_HANDOVER_STEP_TIMEOUT_MS,
            applying_timeout_ms: DEFAULT_MIGRATION_HANDOVER_STEP_TIMEOUT_MS,
            stopping_source_timeout_ms: DEFAULT_MIGRATION_STOPPING_SOURCE_TIMEOUT_MS,
            starting_target_timeout_ms: DEFAULT_MIGRATION_START_TIMEOUT_MS,
        }
    }
}

impl MigrationSettings {
    /// The deadline of `phase`, in milliseconds; none for an ended one.
    pub fn timeout_ms(&self, phase: MigrationPhase) -> Option<u64> {
        Some(match phase {
            MigrationPhase::Placing => self.placing_timeout_ms,
            MigrationPhase::Preparing => self.preparing_timeout_ms,
            MigrationPhase::Starting => self.starting_timeout_ms,
            MigrationPhase::AwaitingReady => self.awaiting_ready_timeout_ms,
            MigrationPhase::StoppingOutput => self.stopping_output_timeout_ms,
            MigrationPhase::Applying => self.applying_timeout_ms,
            MigrationPhase::StoppingSource => self.stopping_source_timeout_ms,
            MigrationPhase::StartingTarget => self.starting_target_timeout_ms,
            // Bounded by the deadlines of the members it waits for.
            MigrationPhase::AwaitingGroup => return None,
            MigrationPhase::Done | MigrationPhase::Aborted | MigrationPhase::Lost => return None,
        })
    }

    /// Each deadline by its settings key, for validation.
    pub fn named(&self) -> [(&'static str, u64); 8] {
        [
            ("placingTimeoutMs", self.placing_timeout_ms),
            ("preparingTimeoutMs", self.preparing_timeout_ms),
            ("startingTimeoutMs", self.starting_timeout_ms),
            ("awaitingReadyTimeoutMs", self.awaiting_ready_timeout_ms),
            ("stoppingOutputTimeoutMs", self.stopping_output_timeout_ms),
            ("applyingTimeoutMs", self.applying_timeout_ms),
            ("stoppingSourceTimeoutMs", self.stopping_source_timeout_ms),
            ("startingTargetTimeoutMs", self.starting_target_timeout_ms),
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::automanager::settings::{AutoSettings, validate_auto_settings};

    #[test]
    fn omitted_migration_deadlines_take_their_defaults() {
        let s: AutoSettings = yaml_serde::from_str("url: m:1\nmigration: {startingTimeoutMs: 5000}\n").unwrap();
        assert_eq!(s.migration.starting_timeout_ms, 5_000);
        assert_eq!(s.migration.placing_timeout_ms, 600_000);
        assert_eq!(s.migration.awaiting_ready_timeout_ms, 30_000);
        assert_eq!(s.migration.stopping_source_timeout_ms, 60_000);
    }

    #[test]
    fn a_zero_migration_deadline_is_refused() {
        let s: AutoSettings = yaml_serde::from_str("url: m:1\nmigration: {applyingTimeoutMs: 0}\n").unwrap();
        let errors = validate_auto_settings(s).unwrap_err().errors;
        assert!(
            errors.iter().any(|e| e.path == "migration.applyingTimeoutMs"),
            "{errors:?}"
        );
    }

    #[test]
    fn a_misspelt_migration_deadline_is_refused() {
        assert!(yaml_serde::from_str::<AutoSettings>("url: m:1\nmigration: {startTimeoutMs: 1}\n").is_err());
    }
}
