//! The migration saga's phases: the core's saga moves through them and a
//! `JobMigration`'s status shows them, so both share these names.

use serde::{Deserialize, Serialize};

super::string_enum! {
    /// Where a migration is. The phases a strategy passes through:
    ///
    /// - `stopThenStart`: `placing -> preparing -> stoppingSource ->
    ///   startingTarget -> done`
    /// - `overlap`: `placing -> starting -> stoppingSource -> done`
    /// - `handover`: `placing -> starting -> awaitingReady -> stoppingOutput ->
    ///   applying -> stoppingSource -> done`
    ///
    /// A member of a co-located group moving together waits in `awaitingGroup`
    /// just before its point of no return (after `preparing`, `starting` or
    /// `awaitingReady`) until the rest of its group is ready too.
    ///
    /// Any phase before the point of no return may end `aborted`; after it a
    /// migration ends `done` (failing forward) or, when its target is lost or
    /// the AutoManager closes, `lost`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum MigrationPhase {
        /// The target is placed on a node that is still being provisioned; its
        /// `StartJob` follows when the node starts.
        Placing,
        /// `stopThenStart`: the target was created with `deferStart`; waiting
        /// for `job_prepared`.
        Preparing,
        /// `overlap` / `handover`: the target was started; waiting for it to
        /// run.
        Starting,
        /// `handover`: both instances were told (`propose`); waiting for the
        /// target's `target_ready`.
        AwaitingReady,
        /// A member of a co-located group is ready to cross its point of no
        /// return (its target prepared, running, or ready); waiting for the
        /// rest of its group to be, so the group cuts over together. No
        /// deadline of its own: each member it waits for has one.
        AwaitingGroup,
        /// `handover`: the source was told to stop output at the target's
        /// payload (the point of no return); waiting for `source_stopped_at`.
        StoppingOutput,
        /// `handover`: the target was told to apply from the source's position;
        /// waiting for `target_applied`.
        Applying,
        /// The source was told to stop (for `stopThenStart` and `overlap`, the
        /// point of no return); waiting for it to stop.
        StoppingSource,
        /// `stopThenStart`: the prepared target was started; waiting for it to
        /// run.
        StartingTarget,
        /// The job lives on the target: binding, placement of record and
        /// active instance key moved there.
        Done,
        /// Rolled back before the point of no return: both instance keys told,
        /// the target stopped, the source still running.
        Aborted,
        /// Past the point of no return and could not finish (its target lost,
        /// or the AutoManager closed): the job is left to what Manager's
        /// history says of it.
        Lost,
    }
}

impl MigrationPhase {
    /// Whether the migration has ended.
    pub fn is_ended(self) -> bool {
        matches!(self, Self::Done | Self::Aborted | Self::Lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{schema_names, serde_names};

    #[test]
    fn the_migration_phase_schema_lists_every_serde_name() {
        assert_eq!(schema_names::<MigrationPhase>(), serde_names(MigrationPhase::ALL));
    }
}
